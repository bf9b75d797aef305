"""A tiny Hugging Face-format Llama with random weights, for running vLLM (or any engine that
loads HF checkpoints) in tests. Nothing is downloaded.

The model directory holds ``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json`` (a byte-level BPE built with the ``tokenizers`` library) and
``tokenizer_config.json`` (with the chat template). Vocabulary and generation behave as in
:mod:`.tiny_gguf` (same words, merges and chat template; an embedding channel held constant makes
every generated token a whole space-led word and keeps EOS out of reach), so prompt lengths are
exact and every streamed chunk carries visible text.

The files are written by the *engine's* Python (``python=``), which has ``tokenizers``,
``safetensors`` and ``numpy`` (vLLM depends on all three); the project's environment needs none
of them. That is why this file runs as a script too: the parent computes the vocabulary and hands
a JSON spec to ``<python> tiny_hf.py SPEC.json``, and the script part imports nothing from
pytest-llmperf.

Defaults: hidden size 128 with 2 heads (head size 64: vLLM's CPU attention kernels refuse small
head sizes such as 16), 2 layers, intermediate size 256; about 1.5 MB of float32 weights.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

# Head sizes vLLM's CPU attention backend accepts (others are rejected at start-up).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 256)
_BUILD_TIMEOUT_S = 300.0


def build_tiny_llama_hf(
    path: str | os.PathLike[str],
    *,
    python: str | os.PathLike[str] | None = None,
    vocab_words: Sequence[str] | None = None,
    n_layer: int = 2,
    hidden: int = 128,
    n_head: int = 2,
    n_ff: int = 256,
    ctx: int = 2048,
    seed: int = 0,
) -> Path:
    """Write the model directory ``path`` (created; it must not exist or be empty) with the
    interpreter ``python`` (default: this one) and return it. The same arguments give the same
    files. Raises :class:`~.tiny_gguf.TinyModelError` for bad arguments and when the writer fails
    (with its error output)."""
    from pytest_llmperf.load.prompts import COMMON_WORDS
    from pytest_llmperf.testing.tiny_gguf import (
        BOS_EOS_TOKEN,
        CHAT_TEMPLATE,
        CONTROL_TOKENS,
        TinyModelError,
        _check_dims,
        build_vocab,
    )

    _check_dims(n_layer, hidden, n_head, n_ff, ctx)
    if hidden // n_head not in CPU_HEAD_SIZES:
        raise TinyModelError(
            f"head size hidden/n_head = {hidden // n_head} is not one vLLM's CPU attention accepts "
            f"({', '.join(map(str, CPU_HEAD_SIZES))})"
        )
    words = COMMON_WORDS if vocab_words is None else vocab_words
    if isinstance(words, str):
        raise TinyModelError("vocab_words must be a sequence of words, not one string")
    vocab = build_vocab(words)
    out = Path(path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TinyModelError(f"model directory {str(out)!r} already exists and is not empty")
    spec = {
        "tokens": list(vocab.tokens), "merges": list(vocab.merges), "word_ids": list(vocab.word_ids),
        "control_tokens": list(CONTROL_TOKENS), "eos_token": BOS_EOS_TOKEN, "eos_id": vocab.eos_id,
        "chat_template": CHAT_TEMPLATE, "n_layer": n_layer, "hidden": hidden, "n_head": n_head,
        "n_ff": n_ff, "ctx": ctx, "seed": seed,
    }
    interpreter = str(python) if python is not None else sys.executable
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        spec_path = staging / "spec.json"
        spec_path.write_text(json.dumps(spec))
        target = staging / "model"
        try:
            done = subprocess.run(
                [interpreter, str(Path(__file__).resolve()), str(spec_path), str(target)],
                capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise TinyModelError(f"cannot run {interpreter} to write the tiny HF model: {exc}") from None
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise TinyModelError(
                f"{interpreter} could not write the tiny HF model (it needs numpy, tokenizers and "
                f"safetensors, which vLLM installs):\n{tail}"
            )
        if out.exists():
            out.rmdir()
        os.replace(target, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


# --------------------------------------------------------------------- the writer (engine's Python)

# As in tiny_gguf: random parts of std ~0.1 and ~0.5, and a constant channel that puts space-led
# words about 60 logits above everything else.
_CONSTANT_VALUE = 1.0
_CHANNEL_BIAS = 5.0
_EMBED_STD = 0.1
_OUTPUT_STD = 0.5


def _hf_weights(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(spec["seed"])
    n_vocab, h, n_ff = len(spec["tokens"]), spec["hidden"], spec["n_ff"]

    def linear(out_f: int, in_f: int) -> Any:
        return rng.normal(0.0, 0.5 / np.sqrt(in_f), size=(out_f, in_f)).astype(np.float32)

    embed = rng.normal(0.0, _EMBED_STD, size=(n_vocab, h)).astype(np.float32)
    embed[:, 0] = _CONSTANT_VALUE
    head = rng.normal(0.0, _OUTPUT_STD, size=(n_vocab, h)).astype(np.float32)
    head[:, 0] = -_CHANNEL_BIAS
    head[spec["word_ids"], 0] = _CHANNEL_BIAS
    ones = np.ones(h, dtype=np.float32)
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": ones.copy(), "lm_head.weight": head}
    for i in range(spec["n_layer"]):
        o_proj, down = linear(h, h), linear(h, n_ff)
        o_proj[0, :] = 0.0  # no layer writes to the constant channel
        down[0, :] = 0.0
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": ones.copy(),
            p + "self_attn.q_proj.weight": linear(h, h),
            p + "self_attn.k_proj.weight": linear(h, h),
            p + "self_attn.v_proj.weight": linear(h, h),
            p + "self_attn.o_proj.weight": o_proj,
            p + "post_attention_layernorm.weight": ones.copy(),
            p + "mlp.gate_proj.weight": linear(n_ff, h),
            p + "mlp.up_proj.weight": linear(n_ff, h),
            p + "mlp.down_proj.weight": down,
        })
    return tensors


def _write_tokenizer(spec: dict[str, Any], out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(spec["tokens"])}
    merges = [tuple(m.split(" ")) for m in spec["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec["control_tokens"]])
    tokenizer.save(str(out / "tokenizer.json"))
    eos = spec["eos_token"]
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eos, "eos_token": eos, "pad_token": eos,
        "add_bos_token": False, "add_eos_token": False, "model_max_length": spec["ctx"],
        "chat_template": spec["chat_template"], "clean_up_tokenization_spaces": False,
    }, indent=1))


def write_model(spec: dict[str, Any], out: Path) -> None:
    """Write the model directory from ``spec`` (what :func:`build_tiny_llama_hf` computed)."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True)
    eos_id = spec["eos_id"]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": spec["hidden"], "intermediate_size": spec["n_ff"],
        "num_attention_heads": spec["n_head"], "num_key_value_heads": spec["n_head"],
        "num_hidden_layers": spec["n_layer"], "vocab_size": len(spec["tokens"]),
        "max_position_embeddings": spec["ctx"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": eos_id, "eos_token_id": eos_id,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": eos_id, "eos_token_id": eos_id}))
    save_file(_hf_weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(spec, out)


if __name__ == "__main__":
    write_model(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
