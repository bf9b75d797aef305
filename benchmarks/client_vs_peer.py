"""Our load generator against a peer benchmark client (AIPerf), side by side, in one run.

    python benchmarks/client_vs_peer.py            # from a fresh clone: creates the peer's venv

Both clients drive the simulator's zero-delay preset (``--stamp-chunks``: every chunk carries
the server's ``time.perf_counter()`` at send) running in its own process, and both run as child
processes of this script, so their CPU is measured the same way (``getrusage`` of children).

- chunks per CPU-second: closed loop at C concurrent streams, 64 tokens per answer. Measured
  *marginally*: two runs of N1 and N2 requests, (chunks2 - chunks1) / (cpu2 - cpu1), so start-up
  (AIPerf's services, tokenizer and dataset; our imports) cancels out.
- dispatch lag at 50/200/1,000 req/s: constant arrivals; lag = actual send - scheduled send,
  the schedule reconstructed the same way for both (first send + i / rate).
- ITL error: measured inter-chunk gap minus the gap the server stamped, over every chunk of a
  run with 1,000 concurrent streams; p50/p99 of its absolute value. Twice: against the zero-delay
  server (which then saturates the machine: the worst case) and against a paced one (the 8B/H100
  preset with 1,024 sequences per step, slowed 10x: a chunk per stream every ~0.3 s, as a loaded
  engine streams).

The peer is installed on first run into ${LLMPERF_CACHE:-~/.cache/pytest-llmperf}/peers/aiperf
(``pip install aiperf``, ~2 minutes, no torch) and runs offline against a tiny word-level
tokenizer built here with the ``tokenizers`` package. If it cannot be installed the peer
columns say so and only our figures print. docs/performance.md has results and profiles.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
MODEL = "llmperf/tiny-sim"  # the zero preset's served model name
CACHE = Path(os.environ.get("LLMPERF_CACHE", Path.home() / ".cache" / "pytest-llmperf"))
PEER_DIR = CACHE / "peers" / "aiperf"

TOKENIZER_SCRIPT = r"""
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
words = ["[UNK]"] + [chr(c) for c in range(33, 127)] + "the of and to in a is that it was".split()
tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece()
tok.save(sys.argv[1] + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 10**6},
          open(sys.argv[1] + "/tokenizer_config.json", "w"))
"""


# ---------------------------------------------------------------------- child: our client


def ours_child(args: argparse.Namespace) -> int:
    """One run of our load generator; prints a JSON line with the records' figures."""
    from pytest_llmperf import Workload
    from pytest_llmperf.load.client import StreamingClient
    from pytest_llmperf.load.loadgen import LoadGenerator, run_sync
    from pytest_llmperf.load.prompts import PromptFactory, estimated_model

    if args.rate:
        w = Workload(input_tokens=64, output_tokens=args.osl, rate_rps=args.rate, arrival="constant",
                     num_requests=args.requests)
    else:
        w = Workload(input_tokens=64, output_tokens=args.osl, concurrency=args.concurrency, num_requests=args.requests)

    async def main() -> dict:
        origin = time.perf_counter()
        factory = PromptFactory(w, estimated_model("chat"))
        conns = args.concurrency or max(64, int(args.rate))
        async with StreamingClient(args.url + "/v1", model=MODEL, origin_s=origin, max_connections=conns) as client:
            gen = LoadGenerator(w, factory.make, client.send, clock=lambda: time.perf_counter() - origin,
                                prepare=client.encode)
            outcome = await gen.run()
        recs = outcome.records
        sends = sorted(r.sent_s for r in recs)
        itl_err = []
        for r in recs:
            if r.ok and r.server_chunk_times_s and len(r.server_chunk_times_s) == len(r.chunk_times_s):
                itl_err.extend(np.abs(np.diff(r.chunk_times_s) - np.diff(r.server_chunk_times_s)).tolist())
        return {"completed": sum(r.ok for r in recs), "failed": sum(not r.ok for r in recs),
                "chunks": sum(len(r.chunk_times_s) for r in recs if r.ok),
                "sends": sends, "itl_err": itl_err}

    print(json.dumps(run_sync(main())))
    return 0


def run_ours(url: str, *, concurrency: int = 0, rate: float = 0.0, requests: int, osl: int) -> tuple[dict, float]:
    cmd = [sys.executable, str(HERE), "_ours", "--url", url, "--requests", str(requests), "--osl", str(osl),
           "--concurrency", str(concurrency), "--rate", str(rate)]
    cpu0 = _children_cpu()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    cpu = _children_cpu() - cpu0
    if out.returncode != 0:
        raise RuntimeError(f"our client failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]), cpu


# ---------------------------------------------------------------------- the peer


def ensure_peer() -> tuple[Path | None, str]:
    """The peer's aiperf executable and a tokenizer folder (created on first use)."""
    exe = PEER_DIR / "bin" / "aiperf"
    python = PEER_DIR / "bin" / "python"
    if not exe.exists():
        print(f"installing the peer (AIPerf) into {PEER_DIR} (first run only, ~2 min)...", flush=True)
        PEER_DIR.parent.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(PEER_DIR)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", "aiperf", "tokenizers"], check=True,
                           timeout=1200)
        except (subprocess.SubprocessError, OSError) as exc:
            shutil.rmtree(PEER_DIR, ignore_errors=True)
            return None, f"AIPerf could not be installed ({exc}); peer columns left empty"
    tok = PEER_DIR / "tiny-tokenizer"
    if not (tok / "tokenizer.json").exists():
        tok.mkdir(exist_ok=True)
        subprocess.run([str(python), "-c", TOKENIZER_SCRIPT, str(tok)], check=True)
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                             capture_output=True, text=True).stdout.strip()
    return exe, f"AIPerf {version}"


def run_peer(exe: Path, url: str, *, concurrency: int = 0, rate: float = 0.0, requests: int, osl: int,
             raw: bool) -> tuple[dict, float]:
    art = Path(tempfile.mkdtemp(prefix="aiperf-"))
    cmd = [str(exe), "profile", "--model", MODEL, "--url", url, "--endpoint-type", "chat", "--streaming",
           "--tokenizer", str(PEER_DIR / "tiny-tokenizer"), "--request-count", str(requests), "--isl", "64",
           "--osl", str(osl), "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--ui-type", "none",
           "--artifact-dir", str(art), "--no-server-metrics", "--no-gpu-telemetry",
           "--export-level", "raw" if raw else "records"]
    cmd += ["--request-rate", str(rate), "--arrival-pattern", "constant"] if rate else ["--concurrency", str(concurrency)]
    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1")
    cpu0 = _children_cpu()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    cpu = _children_cpu() - cpu0
    try:
        summary = json.loads((art / "profile_export_aiperf.json").read_text())
    except (OSError, ValueError):
        raise RuntimeError(f"AIPerf failed (exit {out.returncode}): {(out.stdout + out.stderr)[-2000:]}") from None
    result = {"completed": int(_metric(summary, "request_count") or 0), "sends": [], "itl_err": []}
    if raw:
        for line in (art / "profile_export_raw.jsonl").read_text().splitlines():
            rec = json.loads(line)
            result["sends"].append(rec["start_perf_ns"] / 1e9)
            client, server = [], []
            for resp in rec.get("responses") or []:
                for packet in resp.get("packets") or []:
                    data = packet.get("value", "")
                    if not data.startswith("{"):
                        continue
                    obj = json.loads(data)
                    choices = obj.get("choices") or []
                    if choices and (choices[0].get("delta") or {}).get("content") and "llmperf_server_time" in obj:
                        client.append(resp["perf_ns"] / 1e9)
                        server.append(obj["llmperf_server_time"])
            if len(client) > 1:
                result["itl_err"].extend(np.abs(np.diff(client) - np.diff(server)).tolist())
    shutil.rmtree(art, ignore_errors=True)
    return result, cpu


def _metric(summary: dict, name: str) -> float | None:
    for holder in (summary, summary.get("records", {}), summary.get("metrics", {})):
        value = holder.get(name) if isinstance(holder, dict) else None
        if isinstance(value, dict):
            return value.get("avg")
        if isinstance(value, (int, float)):
            return value
    return None


# ---------------------------------------------------------------------- figures


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def lag_ms(sends: list[float], rate: float) -> tuple[float, float]:
    s = np.sort(np.asarray(sends))
    lag = s - (s[0] + np.arange(len(s)) / rate)
    lag -= min(0.0, lag.min())  # a send ahead of the reconstructed grid moves the grid, not the lag
    return float(np.percentile(lag, 50) * 1e3), float(np.percentile(lag, 99) * 1e3)


PACED = ["--preset", "llama-3.1-8b-h100", "--model", MODEL, "--max-num-seqs", "1024", "--time-scale", "10"]


def start_sim(flags: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(HERE.parent.parent / "src"))
    from pytest_llmperf.servers.process import ServerProcess, free_port

    port = free_port()
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", *(flags or ["--preset", "zero"]), "--stamp-chunks",
         "--port", str(port)],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=str(Path(tempfile.gettempdir()) / "llmperf-vs-peer-sim.log"), startup_timeout_s=30)
    proc.start()
    return proc, f"http://127.0.0.1:{port}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--rates", type=float, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--itl-streams", type=int, default=1000)
    parser.add_argument("--no-peer", action="store_true", help="our figures only")
    parser.add_argument("--parts", nargs="+", choices=("cpu", "lag", "itl"), default=["cpu", "lag", "itl"])
    args = parser.parse_args()
    exe, peer_name = (None, "peer skipped (--no-peer)") if args.no_peer else ensure_peer()
    proc, url = start_sim()
    rows = []
    try:
        print(f"server: simulator preset 'zero' (--stamp-chunks) in its own process; peer: {peer_name}", flush=True)
        for c in args.concurrency if "cpu" in args.parts else []:
            n1, n2 = c * 2, c * 10
            figures = []
            for runner in ("ours", "peer"):
                if runner == "peer" and exe is None:
                    figures.append(None)
                    continue
                (r1, cpu1), (r2, cpu2) = [
                    run_ours(url, concurrency=c, requests=n, osl=64) if runner == "ours"
                    else run_peer(exe, url, concurrency=c, requests=n, osl=64, raw=False)  # type: ignore[arg-type]
                    for n in (n1, n2)]
                chunks = (r2["completed"] - r1["completed"]) * 64
                figures.append(chunks / max(cpu2 - cpu1, 1e-9))
            rows.append((f"chunks per CPU-second, {c} streams", figures[0], figures[1], "higher", ",.0f"))
            print(f"  {rows[-1][0]}: ours {fmt(figures[0], ',.0f')}, peer {fmt(figures[1], ',.0f')}", flush=True)
        for rate in args.rates if "lag" in args.parts else []:
            n = int(min(max(rate * 4, 200), 4000))
            lags = []
            for runner in ("ours", "peer"):
                if runner == "peer" and exe is None:
                    lags.append((None, None))
                    continue
                res, _ = (run_ours(url, rate=rate, requests=n, osl=16) if runner == "ours"
                          else run_peer(exe, url, rate=rate, requests=n, osl=16, raw=True))  # type: ignore[arg-type]
                lags.append(lag_ms(res["sends"], rate))
            rows.append((f"dispatch lag p50 ms, {rate:g} req/s", lags[0][0], lags[1][0], "lower", ".3f"))
            rows.append((f"dispatch lag p99 ms, {rate:g} req/s", lags[0][1], lags[1][1], "lower", ".3f"))
            print(f"  {rows[-1][0]}: ours {fmt(lags[0][1], '.3f')}, peer {fmt(lags[1][1], '.3f')}", flush=True)
        streams = args.itl_streams
        proc.stop()
        itl_runs = (("zero-delay", None, streams * 2), ("paced", PACED, streams)) if "itl" in args.parts else ()
        for label, flags, requests in itl_runs:
            proc, url = start_sim(flags)
            errs = []
            for runner in ("ours", "peer"):
                if runner == "peer" and exe is None:
                    errs.append((None, None))
                    continue
                res, _ = (run_ours(url, concurrency=streams, requests=requests, osl=32) if runner == "ours"
                          else run_peer(exe, url, concurrency=streams, requests=requests, osl=32, raw=True))  # type: ignore[arg-type]
                e = np.asarray(res["itl_err"]) * 1e3
                errs.append((float(np.percentile(e, 50)), float(np.percentile(e, 99))) if len(e) else (None, None))
            proc.stop()
            rows.append((f"ITL error p50 ms, {streams} streams, {label}", errs[0][0], errs[1][0], "lower", ".3f"))
            rows.append((f"ITL error p99 ms, {streams} streams, {label}", errs[0][1], errs[1][1], "lower", ".3f"))
            print(f"  {rows[-1][0]}: ours {fmt(errs[0][1], '.3f')}, peer {fmt(errs[1][1], '.3f')}", flush=True)
    finally:
        proc.stop()
    print(f"\n{'figure':<50} {'ours':>12} {'peer':>12} {'ours/peer':>10}  better")
    for name, ours, peer, better, spec in rows:
        print(f"{name:<50} {fmt(ours, spec):>12} {fmt(peer, spec):>12} {ratio(ours, peer):>10}  {better}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_ours":
        p = argparse.ArgumentParser()
        p.add_argument("_ours")
        p.add_argument("--url")
        p.add_argument("--requests", type=int)
        p.add_argument("--osl", type=int)
        p.add_argument("--concurrency", type=int, default=0)
        p.add_argument("--rate", type=float, default=0.0)
        raise SystemExit(ours_child(p.parse_args()))
    raise SystemExit(main())
