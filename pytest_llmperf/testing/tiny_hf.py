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

The same directory serves the pooling kinds as it is: vLLM's ``--runner pooling --convert embed``
answers ``/v1/embeddings`` (last-token pooling, L2-normalised) and ``/v1/rerank`` (cosine of query
and document embeddings); ``--convert classify`` with ``--hf-overrides`` naming two of the
vocabulary's words (:data:`VLLM_RERANK_OVERRIDES`) makes it a cross-encoder whose score comes from
the LM head's rows for those words, as Qwen3-Reranker is served.

:func:`build_tiny_idefics3_hf` writes a vision-language model around the same text model:
Idefics3 (SmolVLM's architecture: a SigLIP-style ViT, pixel-shuffle connector, Llama text model),
chosen because vLLM's Idefics3 and transformers' ``Idefics3ImageProcessorPil`` import without
torchvision, which vLLM's CPU venv must go without (LLaVA and Qwen2-VL do not: their vLLM modules
import transformers' torchvision image processors). :func:`idefics3_image_tokens` says how many
prompt tokens an image of a given size becomes.
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

# vLLM's online conversion of a causal LM into a cross-encoder (``--convert classify``): the score
# is softmax over the LM head's logits of the two tokens, second against first, as
# Qwen3-Reranker's "no"/"yes". Any two single-token words do; these two are in COMMON_WORDS.
VLLM_RERANK_OVERRIDES = r'{"classifier_from_token": ["\u0120the", "\u0120world"], "method": "from_2_way_softmax"}'

# Idefics3's processor looks these up by name; all of them single special tokens, so an image's
# prompt length follows from its tile grid alone (see idefics3_image_tokens).
IDEFICS3_FAKE_TOKEN = "<fake_token_around_image>"
IDEFICS3_IMAGE_TOKEN = "<image>"
IDEFICS3_GLOBAL_TOKEN = "<global-img>"
IDEFICS3_TOKENS = (
    IDEFICS3_FAKE_TOKEN, IDEFICS3_IMAGE_TOKEN, "<end_of_utterance>", IDEFICS3_GLOBAL_TOKEN,
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
)


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
    spec = _text_spec(vocab_words, n_layer=n_layer, hidden=hidden, n_head=n_head, n_ff=n_ff, ctx=ctx, seed=seed)
    return _run_writer(spec, path, python)


def _text_spec(vocab_words: Sequence[str] | None, *, n_layer: int, hidden: int, n_head: int, n_ff: int, ctx: int,
               seed: int, extra_tokens: Sequence[str] = ()) -> dict[str, Any]:
    """The writer's spec of the text model: vocabulary, merges and sizes (``extra_tokens`` are
    special tokens appended after the vocabulary)."""
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
    return {
        "tokens": [*vocab.tokens, *extra_tokens], "merges": list(vocab.merges), "word_ids": list(vocab.word_ids),
        "control_tokens": [*CONTROL_TOKENS, *extra_tokens], "eos_token": BOS_EOS_TOKEN, "eos_id": vocab.eos_id,
        "chat_template": CHAT_TEMPLATE, "n_layer": n_layer, "hidden": hidden, "n_head": n_head,
        "n_ff": n_ff, "ctx": ctx, "seed": seed,
    }


def _run_writer(spec: dict[str, Any], path: str | os.PathLike[str], python: str | os.PathLike[str] | None) -> Path:
    """Have ``python`` run this file's writer on ``spec`` into a staging directory, then rename
    the model directory into place."""
    from pytest_llmperf.testing.tiny_gguf import TinyModelError

    out = Path(path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TinyModelError(f"model directory {str(out)!r} already exists and is not empty")
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


# --------------------------------------------------------------------- LoRA adapters

HF_LORA_TARGETS = ("q_proj", "v_proj")


def build_tiny_lora_hf(
    path: str | os.PathLike[str],
    *,
    python: str | os.PathLike[str] | None = None,
    n_layer: int = 2,
    hidden: int = 128,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = HF_LORA_TARGETS,
    base_model: str = "tiny-llama",
    seed: int = 0,
) -> Path:
    """Write a random PEFT LoRA adapter directory for :func:`build_tiny_llama_hf`'s model (same
    ``n_layer`` and ``hidden``) with ``python`` and return it: ``adapter_config.json`` (LORA,
    ``r = rank``, ``lora_alpha = alpha``, ``target_modules``) and ``adapter_model.safetensors``
    (``base_model.model.model.layers.N.self_attn.<target>.lora_A.weight`` of shape (rank, hidden)
    and ``.lora_B.weight`` of shape (hidden, rank)), what vLLM's ``--enable-lora --lora-modules
    NAME=PATH`` loads. The query and value projections leave the model's generation rules intact
    (see :func:`~.tiny_gguf.build_tiny_lora_gguf`). The same arguments give the same files."""
    from pytest_llmperf.testing.tiny_gguf import TinyModelError

    _positive(n_layer=n_layer, hidden=hidden, rank=rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise TinyModelError(f"alpha must be a positive number, got {alpha!r}")
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if not targets or any(t not in HF_LORA_TARGETS for t in targets):
        raise TinyModelError(f"targets must be among {', '.join(HF_LORA_TARGETS)}, got {list(targets)}")
    spec = {"lora": {"n_layer": n_layer, "hidden": hidden, "rank": rank, "alpha": float(alpha),
                     "targets": list(targets), "base_model": base_model, "seed": seed}}
    return _run_writer(spec, path, python)


# --------------------------------------------------------------------- a vision-language model

def _positive(**values: int) -> None:
    from pytest_llmperf.testing.tiny_gguf import TinyModelError

    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TinyModelError(f"{name} must be a positive integer, got {value!r}")


def idefics3_grid(width: int, height: int, *, image_size: int = 32, max_tiles: int = 4) -> tuple[int, int]:
    """(rows, columns) of ``image_size`` tiles Idefics3's image processor cuts an image into, or
    (0, 0) when it fits one tile and is sent whole.

    As ``Idefics3ImageProcessor.get_number_of_image_patches`` (transformers 5.19): the image is
    scaled so its longer side is ``max_tiles * image_size`` (the other side rounded down, then up
    to even), and each side is covered by whole tiles."""
    _positive(width=width, height=height, image_size=image_size, max_tiles=max_tiles)
    longest = max_tiles * image_size
    aspect = width / height
    if width >= height:
        w, h = longest, int(longest / aspect)
        h += h % 2
    else:
        h, w = longest, int(longest * aspect)
        w += w % 2
    h, w = max(h, 1), max(w, 1)
    rows, cols = -(-h // image_size), -(-w // image_size)
    return (rows, cols) if rows > 1 or cols > 1 else (0, 0)


def idefics3_image_tokens(width: int, height: int, *, image_size: int = 32, patch_size: int = 8,
                          scale_factor: int = 2, max_tiles: int = 4) -> int:
    """Prompt tokens one ``width`` x ``height`` image takes in :func:`build_tiny_idefics3_hf`'s
    model (its defaults are this function's).

    Each tile is ``s = (image_size / patch_size)² / scale_factor²`` image tokens (the connector
    merges scale_factor² patches into one token). A split image of R x C tiles is written as, per
    tile, ``<fake_token_around_image><row_r_col_c>`` and its s tokens, a newline after each row,
    then a newline and the global view ``<fake_token_around_image><global-img>`` + s tokens, closed
    by ``<fake_token_around_image>``: R·C·(s + 2) + R + 1 + s + 3 tokens. An image sent whole is
    the global view alone: s + 3. The text around the image is not included (vLLM's string chat
    format also adds one newline between the image placeholders and the text)."""
    _positive(patch_size=patch_size, scale_factor=scale_factor)
    per_tile = (image_size // patch_size) ** 2 // scale_factor ** 2
    rows, cols = idefics3_grid(width, height, image_size=image_size, max_tiles=max_tiles)
    if rows == 0:
        return per_tile + 3
    return rows * cols * (per_tile + 2) + rows + 1 + per_tile + 3


def build_tiny_idefics3_hf(
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
    image_size: int = 32,
    patch_size: int = 8,
    scale_factor: int = 2,
    max_tiles: int = 4,
    vision_hidden: int = 64,
    vision_heads: int = 2,
    vision_layers: int = 2,
    vision_ff: int = 128,
) -> Path:
    """Write a random-weight Idefics3 vision-language model directory (the text model of
    :func:`build_tiny_llama_hf` plus a vision tower) with ``python`` and return it.

    Images are cut into tiles of ``image_size`` pixels (at most ``max_tiles`` a side, plus a
    global view), each read by a ``vision_layers``-block ViT of ``patch_size`` patches, whose
    ``scale_factor``² neighbouring patches the connector merges into one token: see
    :func:`idefics3_image_tokens`. The directory adds ``preprocessor_config.json`` and
    ``processor_config.json`` (Idefics3Processor) to the text model's files. Generation behaves as
    the text model's (whole words, no EOS): no layer writes to the constant channel at the last
    position, which is always text."""
    from pytest_llmperf.testing.tiny_gguf import TinyModelError

    _positive(image_size=image_size, patch_size=patch_size, scale_factor=scale_factor, max_tiles=max_tiles,
              vision_hidden=vision_hidden, vision_heads=vision_heads, vision_layers=vision_layers,
              vision_ff=vision_ff)
    side = image_size // patch_size
    if image_size % patch_size or side % scale_factor:
        raise TinyModelError(
            f"image_size ({image_size}) must be a multiple of patch_size ({patch_size}) and give a patch grid "
            f"divisible by scale_factor ({scale_factor})"
        )
    if vision_hidden % vision_heads:
        raise TinyModelError(f"vision_hidden ({vision_hidden}) must be a multiple of vision_heads ({vision_heads})")
    if max_tiles > 6:
        raise TinyModelError(f"max_tiles ({max_tiles}) is at most 6 (Idefics3 names tiles <row_1_col_1>..<row_6_col_6>)")
    spec = _text_spec(vocab_words, n_layer=n_layer, hidden=hidden, n_head=n_head, n_ff=n_ff, ctx=ctx, seed=seed,
                      extra_tokens=IDEFICS3_TOKENS)
    spec["vision"] = {
        "image_size": image_size, "patch_size": patch_size, "scale_factor": scale_factor, "max_tiles": max_tiles,
        "hidden": vision_hidden, "heads": vision_heads, "layers": vision_layers, "ff": vision_ff,
    }
    return _run_writer(spec, path, python)


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


def _vision_weights(spec: dict[str, Any]) -> dict[str, Any]:
    """Idefics3's vision tower (SigLIP-style ViT: patch convolution with bias, one position
    embedding per patch, pre-norm blocks with biases, a final LayerNorm) and its connector (one
    linear map of scale_factor² merged patches to the text width, no bias), HF names."""
    import numpy as np

    v = spec["vision"]
    rng = np.random.default_rng([spec["seed"], 2])
    vh, vff, patch = v["hidden"], v["ff"], v["patch_size"]
    n_pos = (v["image_size"] // patch) ** 2

    def linear(out_f: int, in_f: int) -> Any:
        return rng.normal(0.0, 0.5 / np.sqrt(in_f), size=(out_f, in_f)).astype(np.float32)

    ones, zeros = np.ones(vh, dtype=np.float32), np.zeros(vh, dtype=np.float32)
    p = "model.vision_model."
    tensors = {
        p + "embeddings.patch_embedding.weight": rng.normal(0.0, 0.1, size=(vh, 3, patch, patch)).astype(np.float32),
        p + "embeddings.patch_embedding.bias": zeros.copy(),
        p + "embeddings.position_embedding.weight": rng.normal(0.0, 0.1, size=(n_pos, vh)).astype(np.float32),
        p + "post_layernorm.weight": ones.copy(), p + "post_layernorm.bias": zeros.copy(),
        "model.connector.modality_projection.proj.weight": linear(spec["hidden"], vh * v["scale_factor"] ** 2),
    }
    for i in range(v["layers"]):
        q = f"{p}encoder.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            tensors[q + f"self_attn.{name}.weight"] = linear(vh, vh)
            tensors[q + f"self_attn.{name}.bias"] = zeros.copy()
        for name in ("layer_norm1", "layer_norm2"):
            tensors[q + name + ".weight"] = ones.copy()
            tensors[q + name + ".bias"] = zeros.copy()
        tensors.update({
            q + "mlp.fc1.weight": linear(vff, vh), q + "mlp.fc1.bias": np.zeros(vff, dtype=np.float32),
            q + "mlp.fc2.weight": linear(vh, vff), q + "mlp.fc2.bias": zeros.copy(),
        })
    return tensors


def _write_idefics3(spec: dict[str, Any], out: Path, text_config: dict[str, Any], text: dict[str, Any]) -> None:
    """The vision-language model around the text model: Idefics3's config (the text model's as
    ``text_config``), weights under Idefics3's names, and the processor's two config files."""
    from safetensors.numpy import save_file

    v = spec["vision"]
    tokens = spec["tokens"]
    eos_id = spec["eos_id"]
    config = {
        "architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3",
        "image_token_id": tokens.index(IDEFICS3_IMAGE_TOKEN), "scale_factor": v["scale_factor"],
        "tie_word_embeddings": False, "torch_dtype": "float32", "pad_token_id": eos_id,
        "text_config": {k: val for k, val in text_config.items() if k not in ("architectures", "torch_dtype")},
        "vision_config": {
            "model_type": "idefics3_vision", "hidden_size": v["hidden"], "intermediate_size": v["ff"],
            "num_hidden_layers": v["layers"], "num_attention_heads": v["heads"], "num_channels": 3,
            "image_size": v["image_size"], "patch_size": v["patch_size"], "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    weights = {("model.text_model." + k.removeprefix("model.")) if k.startswith("model.") else k: a
               for k, a in text.items()}
    weights.update(_vision_weights(spec))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    tile = v["image_size"]
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor",
        "do_resize": True, "size": {"longest_edge": v["max_tiles"] * tile}, "max_image_size": {"longest_edge": tile},
        "do_image_splitting": True, "do_pad": True, "do_convert_rgb": True, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "resample": 1,
    }, indent=1))
    per_tile = (tile // v["patch_size"]) ** 2 // v["scale_factor"] ** 2
    (out / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Idefics3Processor", "image_seq_len": per_tile}, indent=1))
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config["processor_class"] = "Idefics3Processor"
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))


def _write_lora(lora: dict[str, Any], out: Path) -> None:
    """A PEFT LoRA adapter directory (see :func:`build_tiny_lora_hf`)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng([lora["seed"], 3])
    r, h = lora["rank"], lora["hidden"]
    tensors = {}
    for i in range(lora["n_layer"]):
        for target in lora["targets"]:
            p = f"base_model.model.model.layers.{i}.self_attn.{target}."
            tensors[p + "lora_A.weight"] = rng.normal(0.0, 1.0 / np.sqrt(h), size=(r, h)).astype(np.float32)
            tensors[p + "lora_B.weight"] = rng.normal(0.0, 0.5 / np.sqrt(r), size=(h, r)).astype(np.float32)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": lora["alpha"], "lora_dropout": 0.0,
        "target_modules": lora["targets"], "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
        "use_rslora": False, "use_dora": False, "base_model_name_or_path": lora["base_model"],
    }, indent=1))


def write_model(spec: dict[str, Any], out: Path) -> None:
    """Write the model directory from ``spec`` (what :func:`build_tiny_llama_hf`,
    :func:`build_tiny_idefics3_hf` or :func:`build_tiny_lora_hf` computed)."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True)
    if "lora" in spec:
        _write_lora(spec["lora"], out)
        return
    eos_id = spec["eos_id"]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": spec["hidden"], "intermediate_size": spec["n_ff"],
        "num_attention_heads": spec["n_head"], "num_key_value_heads": spec["n_head"],
        "num_hidden_layers": spec["n_layer"], "vocab_size": len(spec["tokens"]),
        "max_position_embeddings": spec["ctx"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": eos_id, "eos_token_id": eos_id,
    }
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": eos_id, "eos_token_id": eos_id}))
    _write_tokenizer(spec, out)
    text = _hf_weights(spec)
    if "vision" in spec:
        _write_idefics3(spec, out, config, text)
        return
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(text, str(out / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    write_model(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
