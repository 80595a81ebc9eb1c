"""Launching a vLLM OpenAI-compatible server from its own virtual environment, and syncing its weights.

vLLM pins its own torch and an older transformers than ClawGym, so it runs in a separate venv built by
``scripts/vllm_env.sh`` (``$CLAWGYM_VLLM_VENV``, default ``~/.cache/clawgym/vllm-venv``) and ClawGym
talks to it over HTTP only (:class:`~clawgym_env.policy.vllm.backend.VLLMPolicy`).

Invariants of :class:`VLLMServer`:

* ``start()`` returns only when ``GET /health`` answers 200 *and* a one-token completion succeeded (the
  health check alone passes even when the model cannot run, e.g. vLLM's CPU attention rejects a
  ``head_dim`` it has no kernel for, and the engine dies on the first request); otherwise it stops
  everything it started and raises :class:`PolicyError` with the tail of the server log.
* The server runs in its own process group (API server, engine core and worker processes); ``stop()``
  sends SIGTERM to the group, waits ``grace_s``, then SIGKILLs it. ``stop()`` is idempotent and also
  runs at interpreter exit. The whole output of the server goes to ``log_path``.
* Sampling-relevant flags are always set: ``--logprobs-mode processed_logprobs`` (a logprob is the one
  of the token under the distribution it was drawn from: after temperature/top-p, and the unmodified
  distribution for greedy, as :class:`TransformersPolicy` reports) and ``--generation-config vllm``
  (the model folder's ``generation_config.json`` must not add a hidden top-k or temperature).
* The child never sees this interpreter's ``PYTHONPATH``/``PYTHONHOME``/``VIRTUAL_ENV`` (with
  ``worker_extension`` its ``PYTHONPATH`` is exactly :data:`EXTENSION_DIR`).

Weight sync (:meth:`VLLMServer.reload`), options in vLLM 0.32 and what is used here:

* ``inplace`` (needs ``VLLM_SERVER_DEV_MODE=1``, which this class sets): ``POST /pause?mode=wait``
  (in-flight requests finish on the old weights), ``POST /collective_rpc`` with method ``reload_weights``
  and ``weights_path`` = the new checkpoint folder (every worker re-reads the safetensors in place; same
  architecture and shapes), ``POST /reset_prefix_cache`` (cached KV was computed with the old weights),
  ``POST /resume``. Well under a second for small models; the folder must be readable by the server.
  Measured limitation of vLLM 0.32: with ``tie_word_embeddings`` (the small Qwen3 checkpoints, our tiny
  model) the layerwise reload logs "ParallelLMHead: Failed to load weights" and the output embedding
  keeps its OLD values, silently. So in-place is only used when the served and the new config are untied.
* ``restart``: stop the server and start it on the new folder (always correct; costs a full start).
  ``auto`` (the default) picks ``inplace`` when allowed, else ``restart``.
* ``collective`` (:mod:`clawgym_env.policy.vllm.collective`, needs ``worker_extension=True``): the trainer
  broadcasts each tensor over a private gloo/NCCL group into the workers, which reload them in place
  (no files). Same tied-embedding limit as ``inplace``.
* LoRA adapters (``lora_rank > 0``: ``--enable-lora --max-lora-rank R --max-loras 1`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): the engine serves the frozen base folder and hot-loads each adapter
  version (:mod:`clawgym_env.policy.vllm.admin`, driven by the policy: ``VLLMPolicy.load_adapter`` /
  ``serve_model``); the base weights never change, so a tied embedding is no obstacle.
* Sleep mode (``sleep_mode=True``: ``--enable-sleep-mode``, needs ``dev_mode``): ``VLLMPolicy.sleep`` / ``wake_up``
  around a colocated trainer's update. GPU engines only (vLLM refuses it on the CPU).
* Not used: vLLM's own NCCL/IPC weight-transfer engines behind ``/init_weight_transfer_engine`` +
  ``/update_weights`` (GPU-to-GPU broadcast / CUDA IPC, no CPU backend).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawgym_env.errors import PolicyError
from clawgym_env.policy.rope import RopeScaling, positions
from clawgym_env.policy.vllm.admin import max_lora_rank
from clawgym_env.policy.vllm.backend import VLLMPolicy
from clawgym_env.policy.vllm.options import VLLMPolicyOptions
from clawgym_env.policy.vllm.weights import model_config, reload_inplace, ties_embeddings

if TYPE_CHECKING:
    from typing_extensions import Unpack

VENV_ENV = "CLAWGYM_VLLM_VENV"
SETUP_HINT = "build it with: bash scripts/vllm_env.sh"
_LIVE: weakref.WeakSet[VLLMServer] = weakref.WeakSet()
EXTENSION_DIR = Path(__file__).resolve().parent / "ext"
"""The folder put on the server's ``PYTHONPATH`` when ``worker_extension`` is on (torch-only modules)."""
WORKER_EXTENSION = "clawgym_vllm_ext.WeightReceiverExtension"
"""The ``--worker-extension-cls`` that receives broadcast weights (:mod:`clawgym_env.policy.vllm.ext`)."""


def default_venv() -> Path:
    """``$CLAWGYM_VLLM_VENV``, else ``<clawgym cache>/vllm-venv``."""
    from clawgym_env.policy.tokenizer import cache_dir

    env = os.environ.get(VENV_ENV)
    return Path(env).expanduser() if env else cache_dir() / "vllm-venv"


def vllm_python(venv: str | os.PathLike | None = None) -> Path:
    """The interpreter of the vLLM venv; raises :class:`PolicyError` (with the fix) when it is missing."""
    root = Path(venv).expanduser() if venv else default_venv()
    python = root / "bin" / "python"
    if not python.exists():
        raise PolicyError(f"no vLLM virtual environment at {root} (set {VENV_ENV} to use another); {SETUP_HINT}")
    return python


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """A vLLM OpenAI-compatible server subprocess serving ``model_dir`` (a Hugging Face model folder).

    >>> with VLLMServer(model_dir) as server:
    ...     policy = server.policy()          # a VLLMPolicy bound to this server
    ...     model.save_pretrained(new_dir); policy.sync_weights(new_dir)

    ``max_model_len`` bounds prompt + completion; ``kv_cache_gib`` is vLLM's CPU KV cache
    (``VLLM_CPU_KVCACHE_SPACE``); ``extra_args`` go to vLLM verbatim; ``env`` adds variables.
    ``worker_extension``: load :data:`WORKER_EXTENSION` into every worker (the receiving side of
    :mod:`~clawgym_env.policy.vllm.collective`'s weight broadcast; its folder goes on the server's
    ``PYTHONPATH``, nothing else of ClawGym does). ``rope_scaling``: YaRN the engine applies on top of the
    folder's ``config.json`` (``--hf-overrides``: the ``rope_parameters`` and ``max_position_embeddings`` the
    trainer's model config gets from the same setting); ``max_model_len`` above the positions the folder covers
    (with it) is refused here, naming the setting. ``lora_rank`` > 0: serve runtime-loaded LoRA adapters up to
    that rank; ``sleep_mode``: allow ``/sleep`` and ``/wake_up`` (GPU engines; needs ``dev_mode``).
    """

    def __init__(self, model_dir: str | os.PathLike, *, port: int | None = None, host: str = "127.0.0.1",
                 venv: str | os.PathLike | None = None, served_model_name: str | None = None,
                 dtype: str = "float32", max_model_len: int = 4096, kv_cache_gib: int = 1,
                 enforce_eager: bool = False, dev_mode: bool = True, extra_args: Iterable[str] = (),
                 env: dict[str, str] | None = None, log_path: str | os.PathLike | None = None,
                 startup_timeout_s: float = 900.0, grace_s: float = 20.0, worker_extension: bool = False,
                 rope_scaling: RopeScaling | None = None, lora_rank: int = 0, sleep_mode: bool = False) -> None:
        self.model_dir = Path(model_dir).expanduser().resolve()
        self._check_model_dir(self.model_dir)
        self.python = vllm_python(venv)
        self.host = host
        self.port = int(port) if port else free_port(host)
        self.served_model_name = served_model_name or self.model_dir.name
        self.dtype = dtype
        self.max_model_len = int(max_model_len)
        self.kv_cache_gib = kv_cache_gib
        self.enforce_eager = enforce_eager
        self.dev_mode = dev_mode
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.worker_extension = worker_extension
        self.rope_scaling = rope_scaling
        self.lora_rank = int(lora_rank)
        self.sleep_mode = sleep_mode
        if sleep_mode and not dev_mode:
            raise PolicyError("sleep_mode needs the dev-mode endpoints (/sleep, /wake_up); keep dev_mode=True")
        if self.lora_rank:
            max_lora_rank(self.lora_rank)  # a PolicyError above what vLLM serves
        self._check_context()
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="clawgym-vllm-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.RLock()
        _LIVE.add(self)

    # -- properties ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The server root, ``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server process id (its process group leader), or None before ``start()``."""
        return self._proc.pid if self._proc is not None else None

    def vocab_size(self) -> int | None:
        """The served model's embedding rows (``config.json`` ``vocab_size``), or None."""
        try:
            return int(model_config(self.model_dir)["vocab_size"])
        except (KeyError, TypeError, ValueError):
            return None

    def inplace_ok(self, new_dir: str | os.PathLike) -> tuple[bool, str]:
        """Whether an in-place reload from ``new_dir`` is trustworthy here, and why not."""
        if not self.dev_mode:
            return False, "the dev-mode endpoints are off (VLLMServer(dev_mode=False))"
        for path in (self.model_dir, Path(new_dir)):
            if ties_embeddings(path):
                return False, (f"{path.name} ties its input and output embeddings; vLLM 0.32's in-place "
                               "reload leaves a tied embedding stale (restart instead)")
        return True, ""

    @staticmethod
    def _check_model_dir(path: Path) -> None:
        if not (path / "config.json").exists():
            raise PolicyError(f"{path} is not a model folder (no config.json); pass a folder written by "
                              "save_pretrained, e.g. by build_tiny_qwen3(save_dir=...)")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise PolicyError(f"{path} holds no weights (*.safetensors or *.bin)")

    def hf_overrides(self) -> dict[str, object]:
        """The config keys the engine overrides on the folder's ``config.json`` (``rope_scaling``'s; {} without)."""
        return dict(self.rope_scaling.overrides(model_config(self.model_dir))) if self.rope_scaling else {}

    def _check_context(self) -> None:
        config = {**model_config(self.model_dir), **self.hf_overrides()}
        if "max_position_embeddings" in config and self.max_model_len > positions(config):
            from clawgym_env.policy.rope import context_fix

            raise PolicyError(f"max_model_len {self.max_model_len} is above the {positions(config)} positions "
                              f"{self.model_dir.name} covers{' with its rope_scaling' if self.rope_scaling else ''}; "
                              f"pass rope_scaling=RopeScaling(...) (in a train config: "
                              f"{context_fix(self.max_model_len, positions(config)).strip()}) or lower max_model_len")

    def command(self) -> list[str]:
        """The argv that starts the server."""
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model_dir), "--served-model-name", self.served_model_name,
               "--host", self.host, "--port", str(self.port), "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--logprobs-mode", "processed_logprobs",
               "--generation-config", "vllm", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.worker_extension:
            cmd += ["--worker-extension-cls", WORKER_EXTENSION]
        if self.rope_scaling is not None:
            cmd += ["--hf-overrides", json.dumps(self.hf_overrides(), sort_keys=True)]
        if self.lora_rank:
            cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank(self.lora_rank)), "--max-loras", "1"]
        if self.sleep_mode:
            cmd.append("--enable-sleep-mode")
        return cmd + self.extra_args

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        venv_bin = str(self.python.parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = str(self.python.parent.parent)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.worker_extension:
            env["PYTHONPATH"] = str(EXTENSION_DIR)
        if self.lora_rank:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.update(self.extra_env)
        return env

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> VLLMServer:
        """Launch and wait until it serves (idempotent while running). Raises :class:`PolicyError`."""
        with self._lock:
            if self.running:
                return self
            t0 = time.monotonic()
            with open(self.log_path, "ab") as log:
                log.write(f"\n==== clawgym: {' '.join(self.command())}\n".encode())
                log.flush()
                self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=self._child_env(),
                                              start_new_session=True)
            try:
                self._wait_healthy(t0)
                self._warmup()
            except BaseException:
                self.stop()
                raise
            self.start_seconds = time.monotonic() - t0
            return self

    def _wait_healthy(self, t0: float) -> None:
        import httpx

        deadline = t0 + self.startup_timeout_s
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while True:
                code = self._proc.poll() if self._proc else -1
                if code is not None:
                    raise PolicyError(f"the vLLM server exited with code {code} while starting; "
                                      f"log {self.log_path}:\n{self.log_tail()}")
                try:
                    if client.get("/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise PolicyError(f"the vLLM server did not become healthy within "
                                      f"{self.startup_timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}")
                time.sleep(0.5)

    def _warmup(self) -> None:
        """One one-token completion: proves the engine can actually run this model."""
        import httpx

        body = {"model": self.served_model_name, "prompt": [0], "max_tokens": 1, "temperature": 0.0}
        try:
            resp = httpx.post(self.url + "/v1/completions", json=body, timeout=self.startup_timeout_s)
            ok, detail = resp.status_code == 200, f"HTTP {resp.status_code}: {resp.text[:300]}"
        except httpx.HTTPError as exc:
            ok, detail = False, str(exc)
        if not ok:
            raise PolicyError(f"the vLLM server is up but cannot generate with {self.model_dir} ({detail}); "
                              f"log {self.log_path}:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``grace_s`` (idempotent)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
            pgid = proc.pid  # start_new_session: the server leads its own group, even after it exited
            self._signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass
            self._signal_group(pgid, signal.SIGKILL)  # stragglers (engine core, workers) too
            try:
                proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be refused
                pass
            self._wait_group_gone(pgid, self.grace_s)

    @staticmethod
    def _wait_group_gone(pgid: int, timeout: float) -> None:
        """Wait until no process of group ``pgid`` is alive (killed workers take a moment to exit)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = False
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == pgid and fields[0] != "Z":
                    alive = True
                    break
            if not alive:
                return
            time.sleep(0.05)

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def restart(self, model_dir: str | os.PathLike | None = None) -> None:
        """Stop the server and start it again, on ``model_dir`` when given."""
        with self._lock:
            if model_dir is not None:
                new = Path(model_dir).expanduser().resolve()
                self._check_model_dir(new)
                self.model_dir = new
            self.stop()
            self.start()

    def reload(self, model_dir: str | os.PathLike, method: str = "auto") -> str:
        """Serve the weights in ``model_dir`` from now on; returns the method used.

        ``method``: ``inplace`` (dev-mode endpoints, no restart), ``restart``, or ``auto`` (inplace when
        :meth:`inplace_ok`, else restart). Raises :class:`PolicyError`; after a failed in-place reload the
        server keeps serving (possibly partly updated weights: reload again or restart).
        """
        if method not in ("auto", "inplace", "restart"):
            raise PolicyError(f"unknown reload method {method!r}; use auto, inplace or restart")
        new = Path(model_dir).expanduser().resolve()
        self._check_model_dir(new)
        ok, why = self.inplace_ok(new)
        if method == "auto":
            method = "inplace" if ok else "restart"
        with self._lock:
            if method == "restart":
                self.restart(new)
                return method
            if not ok:
                raise PolicyError(f"cannot reload in place: {why}; use method='restart' or 'auto'")
            if not self.running:
                raise PolicyError(f"the vLLM server is not running (log {self.log_path}); start() it first")
            import httpx

            with httpx.Client(base_url=self.url) as client:
                reload_inplace(client, new)
            self.model_dir = new
            return method

    def policy(self, **options: Unpack[VLLMPolicyOptions]) -> VLLMPolicy:
        """A :class:`VLLMPolicy` bound to this server (so ``sync_weights`` reloads it); ``options``:
        :class:`~clawgym_env.policy.vllm.options.VLLMPolicyOptions` (``vocab_size`` defaults to the server's)."""
        options.setdefault("vocab_size", self.vocab_size())
        return VLLMPolicy(self.url, model=self.served_model_name, server=self, **options)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log (route listings left out)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        keep = [ln for ln in text if "Route:" not in ln]
        return "\n".join(keep[-lines:])

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"VLLMServer({self.model_dir.name!r}, url={self.url!r}, {state})"


@atexit.register
def _stop_all() -> None:  # pragma: no cover - interpreter exit
    for server in list(_LIVE):
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            print(f"clawgym: could not stop {server!r}", file=sys.stderr)
