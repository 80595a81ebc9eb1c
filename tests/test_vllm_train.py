"""Generation on vLLM inside training: weight sync (in place and by broadcast) and ``open_generation``.

Without a server: the weight folders of :class:`VLLMSync`, the generation config, the worker
extension's isolation from ClawGym's dependencies, and the weight broadcast between two real
processes over gloo (the trainer's :class:`WeightBroadcaster` against a stand-in engine that runs the
real worker extension behind the same HTTP routes as vLLM's). Routing and the version gate with fake
replicas: tests/test_vllm_routing.py.

With the real server (``vllm`` + ``slow``, one server for the module, started by ``open_generation``):
rollout calls keep running while the weights are pushed by broadcast and by in-place reload; none
fails and each records exactly the version whose weights sampled it (its logprobs are recomputed by
transformers under that version's weights).
"""

from __future__ import annotations

import http.server
import json
import multiprocessing as mp
import threading
import time
from pathlib import Path

import pytest
from test_vllm_backend import TOL, max_diff, recomputed, server_test
from test_vllm_routing import Engine, FakeReplica, ctx

from clawgym_env.errors import ConfigError, PolicyError
from clawgym_env.policy.base import SamplingParams
from clawgym_env.policy.replicas import ReplicaPolicy


# -- the weight broadcast between two processes (gloo) ---------------------------------------------------
def _fake_engine(conn) -> None:
    """A stand-in vLLM engine in its own process: vLLM's dev routes over HTTP, the real worker extension
    mixed into a worker whose model is a ``Linear(4, 3)``; ``GET /state`` shows the weights."""
    import torch

    from clawgym_env.policy.vllm.ext.clawgym_vllm_ext import WeightReceiverExtension

    model = torch.nn.Linear(4, 3)

    class Runner:
        def reload_weights(self, weights_iterator, is_checkpoint_format):
            params = dict(model.named_parameters())
            with torch.no_grad():
                for name, tensor in weights_iterator:
                    params[name].copy_(tensor)  # an unknown name: KeyError, as vLLM's load_weights

    class Worker(WeightReceiverExtension):
        rank = 0
        model_runner = Runner()

    worker, paths = Worker(), []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, code, out):
            body = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802
            path = self.path.split("?")[0]
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            paths.append(body.get("method", path))
            if path != "/collective_rpc":
                return self._send(200, {})
            try:
                self._send(200, {"results": [getattr(worker, body["method"])(**body.get("kwargs", {}))]})
            except Exception as exc:  # noqa: BLE001 - answered as vLLM does: an HTTP error
                self._send(500, {"error": repr(exc)})

        def do_GET(self):  # noqa: N802
            self._send(200, {"weight": model.weight.tolist(), "bias": model.bias.tolist(), "paths": paths})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    conn.send(server.server_address[1])
    server.serve_forever()


@pytest.mark.slow
def test_weight_broadcast_into_a_worker_extension_over_gloo():
    import httpx
    import torch

    from clawgym_env.policy.vllm.collective import WeightBroadcaster

    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_fake_engine, args=(child,), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "the stand-in engine did not start"
        url = f"http://127.0.0.1:{parent.recv()}"
        sender = WeightBroadcaster([url], timeout_s=30)
        assert sender.spec.world_size == 2 and sender.spec.backend == "gloo"
        weight, bias = torch.randn(3, 4), torch.randn(3)
        sender.push([("weight", weight), ("bias", bias)])
        state = httpx.get(url).json()
        assert torch.equal(torch.tensor(state["weight"]), weight) and torch.equal(torch.tensor(state["bias"]), bias)
        assert state["paths"][-4:] == ["/pause", "clawgym_update_weights", "/reset_prefix_cache", "/resume"]
        # a name the model lacks: the worker still takes every tensor, the push fails naming it, the engine
        # is resumed, and the group stays usable
        with pytest.raises(PolicyError, match="nope"):
            sender.push([("nope", torch.zeros(2)), ("bias", torch.zeros(3))])
        assert httpx.get(url).json()["paths"][-1] == "/resume"
        sender.push([("bias", bias * 2)])
        assert torch.equal(torch.tensor(httpx.get(url).json()["bias"]), bias * 2)
        sender.close()
        assert httpx.get(url).json()["paths"][-1] == "clawgym_close_weight_group"
        with pytest.raises(PolicyError, match="closed"):
            sender.push([("bias", bias)])
    finally:
        proc.kill()
        proc.join(10)


def test_the_worker_extension_imports_without_clawgym(tmp_path):
    """The vLLM venv has torch but not ClawGym's dependencies: the extension folder alone must do."""
    import os
    import subprocess
    import sys

    from clawgym_env.policy.vllm.server import EXTENSION_DIR, WORKER_EXTENSION

    module, _, cls = WORKER_EXTENSION.partition(".")
    code = (f"import sys, {module}; assert hasattr({module}.{cls}, 'clawgym_update_weights'); "
            "print(sorted(m for m in sys.modules if m.startswith('clawgym')))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(EXTENSION_DIR)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"[{module!r}]"


def test_server_command_with_the_worker_extension(tmp_path, monkeypatch):
    from clawgym_env.policy.vllm.server import EXTENSION_DIR, WORKER_EXTENSION, VLLMServer

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # the server is never started here
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors").touch()
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    plain = VLLMServer(tmp_path / "m", venv=venv, port=1)
    with_ext = VLLMServer(tmp_path / "m", venv=venv, port=1, worker_extension=True)
    assert "--worker-extension-cls" not in plain.command() and "PYTHONPATH" not in plain._child_env()
    cmd = with_ext.command()
    assert cmd[cmd.index("--worker-extension-cls") + 1] == WORKER_EXTENSION
    assert with_ext._child_env()["PYTHONPATH"] == str(EXTENSION_DIR)


def test_wire_metadata_round_trip():
    import torch

    from clawgym_env.policy.vllm.ext.clawgym_vllm_ext import GroupSpec, decode_meta, encode_meta

    meta = decode_meta(encode_meta([("a", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(()))]))
    assert [(m.name, m.dtype, m.shape) for m in meta] == [("a", "bfloat16", (2, 3)), ("b", "float32", ())]
    with pytest.raises(ValueError, match="dtype"):
        encode_meta([("c", torch.zeros(1, dtype=torch.complex64))])
    spec = GroupSpec("127.0.0.1", 1234, 3, "nccl", 5.0)
    assert GroupSpec.from_json(spec.to_json()) == spec


# -- VLLMSync and open_generation without a server ---------------------------------------------------------
class Trainee:
    """What VLLMSync and open_generation need of a TrainablePolicy: merged weights, the LM, the tokenizer."""

    def __init__(self, model, tokenizer) -> None:
        self.causal_lm, self.tokenizer, self.gathers = model, tokenizer, 0

    def serving_state_dict(self):
        self.gathers += 1
        return {k: v.detach().clone() for k, v in self.causal_lm.state_dict().items()}


def _untied_tiny(tokenizer, seed=0):
    import torch

    from clawgym_env.policy.tiny import build_tiny_qwen3

    model = build_tiny_qwen3(tokenizer, heads=2, kv_heads=1, seed=seed)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    return model


class FakeServer:
    def __init__(self, model_dir) -> None:
        self.model_dir = Path(model_dir)
        self.reloads: list[tuple[Path, str]] = []

    def reload(self, model_dir, method="auto"):
        self.reloads.append((Path(model_dir), method))
        self.model_dir = Path(model_dir)
        return "inplace"


@pytest.mark.slow
def test_vllm_sync_writes_loadable_folders_and_reloads_every_engine(tokenizer, tmp_path):
    import torch

    from clawgym_env.policy.transformers_backend import TransformersPolicy
    from trainers.scale.weight_sync import GatherOnlySync, VLLMSync, write_model_dir

    model = _untied_tiny(tokenizer)
    trainee = Trainee(model, tokenizer)
    first = write_model_dir(trainee.serving_state_dict(), model, tokenizer, tmp_path / "serving" / "v0")
    servers = [FakeServer(first), FakeServer(first)]
    engine = Engine()
    serving = ReplicaPolicy([FakeReplica(i, engine) for i in range(2)], metrics_urls=[None, None])
    sync = VLLMSync(serving, servers, method="inplace", root=tmp_path / "serving", model=model,  # type: ignore[arg-type]
                    tokenizer=tokenizer, keep=1)
    for version in (1, 2, 3):
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
        assert sync.push(trainee, version) == version == serving.version
    assert [v for _, v in servers[0].reloads] == ["inplace"] * 3 and servers[1].reloads == servers[0].reloads
    assert sorted(p.name for p in (tmp_path / "serving").iterdir()) == ["v3"]  # keep=1: the served one
    loaded = TransformersPolicy.from_pretrained(tmp_path / "serving" / "v3", device="cpu").model
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    row = sync.step_metrics()
    assert row["weight_sync_s"] is not None and row["replica_calls/r0"] == 0.0
    with pytest.raises(PolicyError, match="must increase"):
        sync.push(trainee, 3)
    # a rank other than 0 only joins the gather
    other = GatherOnlySync()
    before = trainee.gathers
    assert other.push(trainee, 7) == 7 and trainee.gathers == before + 1 and other.step_metrics() == {}
    assert other.serving is None


def test_generation_config_and_the_transformers_backend(tokenizer, tmp_path):
    from trainers.rollouts.generation import GenerationConfig, _sync_method, open_generation
    from trainers.scale.weight_sync import GatherOnlySync, InProcessSync

    with pytest.raises(ValueError, match="backend"):
        GenerationConfig(backend="sglang")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sync"):
        GenerationConfig(sync="nccl")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpus"):
        GenerationConfig(backend="vllm", replicas=2, tensor_parallel_size=2, gpus=[0, 1, 2])
    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    assert _sync_method(GenerationConfig(), tied) == "restart"
    with pytest.raises(ConfigError, match="tied"):
        _sync_method(GenerationConfig(sync="collective"), tied)
    (tied / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    assert _sync_method(GenerationConfig(), tied) == "inplace"

    class Plain:
        lora = False

        def __init__(self, model):
            self.causal_lm = self.module = model
            self.tokenizer = tokenizer

        def serving_copy(self):
            return _untied_tiny(tokenizer)

        def serving_state_dict(self):
            return self.causal_lm.state_dict()

    with open_generation(GenerationConfig(), Plain(_untied_tiny(tokenizer)), tmp_path, max_context_tokens=64) as sync:
        assert isinstance(sync, InProcessSync) and sync.serving.version == 0 and sync.step_metrics() == {}
    built = GatherOnlySync()  # a sync built before the module was sharded is used as it is
    with open_generation(GenerationConfig(), None, tmp_path, max_context_tokens=64, in_process=built) as sync:
        assert sync is built


# -- against the real server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tokenizer, tmp_path_factory):
    """One vLLM engine started by ``open_generation`` (broadcast sync, so the worker extension is in)."""
    pytest.importorskip("torch")
    from trainers.rollouts.generation import GenerationConfig, open_generation

    trainee = Trainee(_untied_tiny(tokenizer), tokenizer)
    cfg = GenerationConfig(backend="vllm", sync="collective", dtype="float32", enforce_eager=True, kv_cache_gib=1)
    out = tmp_path_factory.mktemp("vllm-train")
    with open_generation(cfg, trainee, out, max_context_tokens=2048) as sync:
        yield trainee, sync, out


def _reference(state, tokenizer):
    from clawgym_env.policy.transformers_backend import TransformersPolicy

    model = _untied_tiny(tokenizer)
    model.load_state_dict(state)
    return TransformersPolicy(model, tokenizer)


@server_test
def test_episode_calls_reuse_the_prefix_cache(engine, tokenizer):
    from clawgym_env.policy.chat_format import render_prompt_ids

    _, sync, _ = engine
    serving = sync.serving
    assert serving.replicas[0].max_model_len == 2048  # the trainer's max_context_tokens
    sync.step_metrics()
    messages = [{"role": "system", "content": "You are a careful agent. " * 40},
                {"role": "user", "content": "List the files."}]
    for turn in range(3):
        ids = render_prompt_ids(tokenizer, messages)
        gen = serving.generate(ids, SamplingParams(max_tokens=8, seed=turn), ctx("episode-1"))
        messages += [{"role": "assistant", "content": tokenizer.decode(gen.token_ids)},
                     {"role": "user", "content": f"And turn {turn}?"}]
    row = sync.step_metrics()
    print(f"\n[vllm] prefix-cache hit rate of a 3-call episode: {row['prefix_cache_hit_rate']:.2f}")
    assert row["prefix_cache_hit_rate"] > 0.3 and row["replica_calls/r0"] == 3.0


@server_test
def test_calls_in_flight_during_pushes_keep_exact_versions(engine, tokenizer):
    import torch

    from clawgym_env.policy.chat_format import render_prompt_ids
    from trainers.scale.weight_sync import VLLMSync

    trainee, broadcast_sync, out = engine
    serving = broadcast_sync.serving
    file_sync = VLLMSync(serving, broadcast_sync.servers, method="inplace", root=out / "serving",
                         model=trainee.causal_lm, tokenizer=tokenizer)
    states = {0: trainee.serving_state_dict()}
    stop, results, errors = threading.Event(), [], []

    def worker(w):
        n = 0
        while not stop.is_set():
            ids = render_prompt_ids(tokenizer, [{"role": "user", "content": f"Worker {w}, call {n}: go."}])
            try:
                results.append((ids, serving.generate(ids, SamplingParams(max_tokens=10, seed=n), ctx(f"w{w}"))))
            except Exception as exc:  # noqa: BLE001 - collected and asserted empty
                errors.append(exc)
            n += 1

    def wait_for(count, version):
        deadline = time.monotonic() + 120
        while sum(g.policy_version == version for _, g in results) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    try:
        for version, sync in ((1, broadcast_sync), (2, file_sync)):
            wait_for(3, version - 1)
            with torch.no_grad():
                trainee.causal_lm.model.layers[0].mlp.down_proj.weight.mul_(4.0)
                trainee.causal_lm.lm_head.weight.mul_(1.5)
            assert sync.push(trainee, version) == version  # calls keep arriving meanwhile
            states[version] = trainee.serving_state_dict()
            took = sync.step_metrics()["weight_sync_s"]
            print(f"\n[vllm] push v{version} by {serving.last_sync['method']}: {took:.2f} s")
        wait_for(3, 2)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]
    assert {g.policy_version for _, g in results} == {0, 1, 2}
    refs = {v: _reference(s, tokenizer) for v, s in states.items()}
    worst, stale = 0.0, 0.0
    for ids, gen in results:
        assert len(gen.token_ids) == 10
        worst = max(worst, max_diff(gen.logprobs, recomputed(refs[gen.policy_version], ids, gen.token_ids)[0]))
        other = refs[(gen.policy_version + 1) % 3]
        stale = max(stale, max_diff(gen.logprobs, recomputed(other, ids, gen.token_ids)[0]))
    print(f"[vllm] {len(results)} calls across 2 pushes: max |logprob - recomputed at its version| = {worst:.1e}")
    assert worst < TOL and stale > 100 * TOL  # sampled by its version's weights, and the versions differ
