"""irdma.torch with real daemons and real worker processes.

DistributedOptimizer and the DDP hook are checked against what one process
computes with the same arithmetic (the daemon's rank-ordered sums, the
compressions' casts), and against DDP on Gloo; compression against the
digits accuracy without it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the 'torch' extra)")

from irdma import Client, narrowing  # noqa: E402
from irdma.cli.local import free_ports  # noqa: E402
from irdma.errors import StepMismatch  # noqa: E402
from irdma.protocol import WIRE_BFLOAT16  # noqa: E402
from irdma.torch import (  # noqa: E402
    BF16,
    FP16,
    NONE,
    Compression,
    DistributedOptimizer,
)
from irdma.torch.compression import (  # noqa: E402
    TopK,
    bf16_bits,
    pack_pairs,
    unpack_pairs,
)
from irdma.torch.optimizer import compression_for  # noqa: E402

from .helpers.cluster import Cluster  # noqa: E402
from .torch_workers import (  # noqa: E402
    DIGITS,
    LOSS,
    VARIANTS,
    Variant,
    batch,
    forward,
    make_model,
    sgd,
    skips_fc2,
)

ROOT = Path(__file__).resolve().parent.parent


def run_workers(cluster: Cluster, n: int, args: list[str], tmp: Path, timeout: float) -> list[dict]:
    """``n`` processes of ``tests.torch_workers`` with RANK/WORLD_SIZE; their JSON lines."""
    argv = [sys.executable, "-m", "tests.torch_workers", *args]
    procs = []
    logs = []
    try:
        for rank in range(n):
            env = dict(
                os.environ, RANK=str(rank), WORLD_SIZE=str(n), IRDMA_CONFIG=str(cluster.config_path)
            )
            log = tmp / f"worker-{rank}.log"
            logs.append(log)
            with open(log, "wb") as err:
                procs.append(
                    subprocess.Popen(
                        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True
                    )
                )
        results = []
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"rank {rank}: {logs[rank].read_text()[-3000:]}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def trained(out: Path, variant: str, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(out / f"{variant}-{rank}.pt")


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), (
            f"{what}: {k} differs by up to {(got[k] - want[k]).abs().max().item():g}"
        )


# -- the single-process reference ---------------------------------------------------------


def reduce_reference(
    c: Compression, grads: list[torch.Tensor], residuals: list[dict], key: str, average: bool
) -> torch.Tensor:
    """What the workers agree on for one parameter, computed in one process."""
    w = len(grads)
    if c.kind == "none":
        total = grads[0].clone()
        for g in grads[1:]:
            total += g
        return total / w if average else total
    if c.kind in ("fp16", "bf16"):
        # Each contribution divided (when averaging) and rounded; the daemon adds
        # them in float32 in rank order; the sum comes back rounded the same way.
        total = torch.zeros(grads[0].shape, dtype=torch.float32)
        for g in grads:
            if c.kind == "fp16":  # cast, then divide, as torch's fp16_compress_hook
                total += (g.to(torch.float16) / w if average else g.to(torch.float16)).float()
            else:
                total += (g.float() / w if average else g.float()).to(torch.bfloat16).float()
        narrow = torch.float16 if c.kind == "fp16" else torch.bfloat16
        return total.to(narrow).float()
    # top-k with error feedback: each rank sends its largest k of gradient + residual.
    total = torch.zeros(grads[0].numel())
    for r, g in enumerate(grads):
        corrected = g.reshape(-1) + residuals[r][key] if key in residuals[r] else g.reshape(-1)
        k = max(1, math.ceil(c.ratio * corrected.numel()))
        idx = torch.topk(corrected.abs(), k, sorted=False).indices
        sent = torch.zeros_like(corrected)
        sent[idx] = corrected[idx]
        residuals[r][key] = corrected - sent
        total += sent
    return (total / w if average else total).reshape(grads[0].shape)


def reference(spec: Variant, world: int, steps: int) -> dict[str, torch.Tensor]:
    model = make_model()  # rank 0's weights, which broadcast_parameters spread
    opt = spec.optimizer(model.parameters())
    named = list(model.named_parameters())
    residuals: list[dict] = [{} for _ in range(world)]
    for step in range(steps):
        grads = []
        for rank in range(world):
            model.zero_grad(set_to_none=True)
            for micro in range(spec.passes):
                x, y = batch(rank, step, micro)
                LOSS(forward(model, x, skips_fc2(spec, rank, step)), y).backward()
            grads.append(
                {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in named}
            )
        for n, p in named:
            c = compression_for(spec.compression, n, p)
            p.grad = reduce_reference(
                c, [g[n] for g in grads], residuals, n, spec.op == "average"
            ).reshape(p.shape)
        opt.step()
    return {n: p.detach().clone() for n, p in named}


# -- DistributedOptimizer -------------------------------------------------------------------

STEPS = 4


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_optimizer_equals_one_process_doing_the_summed_steps(
    cluster: Cluster, tmp_path: Path, world: int
) -> None:
    """Adam, AdamW and SGD, with every compression, on 2 and 4 worker processes:
    each worker ends with exactly the parameters one process computes from
    the same gradients reduced with the same arithmetic."""
    torch.set_num_threads(1)  # as in the workers: the same kernels, the same bits
    name = f"opt-{uuid.uuid4().hex[:8]}"
    results = run_workers(
        cluster, world, ["optimizer", name, str(tmp_path), str(STEPS)], tmp_path, 100
    )
    n = sum(p.numel() for p in make_model().parameters())
    for variant, spec in VARIANTS.items():
        want = reference(spec, world, STEPS)
        for rank in range(world):
            assert_same(trained(tmp_path, variant, rank), want, f"{variant} rank {rank}")
    # What went on the wire, per worker: float32 sums, half of it in fp16.
    for res in results:
        t = res["traffic"]
        assert t["adam"] == [STEPS * 4 * n, STEPS * 4 * n]
        assert t["adam-fp16"] == [STEPS * 2 * n, STEPS * 2 * n]
        assert t["adam-bf16"] == [STEPS * 2 * n, STEPS * 2 * n]
        pairs = sum(max(1, math.ceil(0.2 * p.numel())) for p in make_model().parameters())
        assert t["adam-topk"] == [STEPS * 8 * pairs, STEPS * 8 * pairs * (world - 1)]
    # Every job removed its tensors when it closed.
    with Client(cluster.config_path) as c:
        assert not [i.name for i in c.list(f".collectives/{name}")]


# -- the DDP hook ----------------------------------------------------------------------------


def test_ddp_hook_equals_ddp_on_gloo(cluster: Cluster, tmp_path: Path) -> None:
    """Two ranks: sums of two are the same whichever rank adds, so irdma's hook
    must give Gloo's result exactly (and its fp16 hook torch's fp16 hook's)."""
    torch.set_num_threads(1)
    world = 2
    name = f"ddp-{uuid.uuid4().hex[:8]}"
    port = free_ports("127.0.0.1", 1)[0]
    results = run_workers(
        cluster, world, ["ddp", name, str(tmp_path), str(STEPS), str(port)], tmp_path, 100
    )
    n = sum(p.numel() for p in make_model().parameters())
    for res in results:  # the hook did send every bucket, every step
        assert res["sent"] == {
            "irdma": STEPS * 4 * n,
            "irdma-fp16": STEPS * 2 * n,
            "irdma-bf16": STEPS * 2 * n,
        }
    for rank in range(world):
        gloo = trained(tmp_path, "gloo", rank)
        # fp16 changes the result, so the fp16 comparison below tells the hooks apart.
        assert not torch.equal(
            gloo["fc1.weight"], trained(tmp_path, "gloo-fp16", rank)["fc1.weight"]
        )
        assert_same(trained(tmp_path, "irdma", rank), gloo, f"irdma hook, rank {rank}")
        assert_same(
            trained(tmp_path, "irdma-fp16", rank),
            trained(tmp_path, "gloo-fp16", rank),
            f"irdma fp16 hook, rank {rank}",
        )
        # bf16 is summed in float32 (Gloo's bf16 hook sums in bfloat16): the reference.
        assert_same(
            trained(tmp_path, "irdma-bf16", rank),
            reference(Variant(sgd, BF16), world, STEPS),
            f"irdma bf16 hook, rank {rank}",
        )
        # And training did move the weights.
        assert not torch.equal(gloo["fc2.weight"], make_model().fc2.weight)
    with Client(cluster.config_path) as c:
        assert not [i.name for i in c.list(f".collectives/{name}")]


# -- compression and accuracy --------------------------------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """bench/train_digits.py's shuffled digits, cut in halves, as one .npz (so the
    workers need no scikit-learn). Half for testing (899 images, 0.11 points each)
    rather than the benchmark's fifth (360, 0.28 points): a 0.5-point bound on
    a fifth would be under two images, below what any two runs differ by."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (the 'train' extra)")
    from train_digits import load_data  # bench/, on sys.path through tests.torch_workers

    x_train, y_train, x_test, y_test = load_data()
    x, y = np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test])
    cut = len(x) // 2
    path = tmp_path_factory.mktemp("digits") / "digits.npz"
    np.savez(path, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])
    yield path


def test_fp16_and_bf16_keep_the_digits_accuracy(
    cluster: Cluster, tmp_path: Path, digits: Path
) -> None:
    """Two workers train the digits CNN three times: uncompressed, fp16, bf16."""
    epochs = 40
    name = f"digits-{uuid.uuid4().hex[:8]}"
    results = run_workers(
        cluster, 2, ["digits", name, str(tmp_path), str(epochs), str(digits)], tmp_path, 110
    )
    acc = results[0]
    assert acc["none"] >= 0.95, acc  # trained, so the comparison means something
    for kind in ("fp16", "bf16"):
        assert abs(acc[kind] - acc["none"]) <= 0.005, (kind, acc)
    assert acc["sent-fp16"] * 2 == acc["sent-none"]
    assert set(DIGITS) == {"none", "fp16", "bf16"}
    print(json.dumps(acc))  # the figures, for -s


# -- in one process ------------------------------------------------------------------------


def test_the_package_does_not_shadow_torch() -> None:
    import irdma.pytorch
    import irdma.torch.optimizer
    import irdma.torch.reducer

    assert irdma.torch.optimizer.torch is torch
    assert irdma.torch.reducer.torch is torch
    assert irdma.pytorch.ParameterServerOptimizer is irdma.torch.ParameterServerOptimizer


def test_compression_choices() -> None:
    assert Compression.parse("fp16") == FP16
    assert Compression.parse("bf16") == BF16
    assert Compression.parse("none") == NONE
    assert Compression.parse("topk:0.05") == Compression.topk(0.05)
    for bad in ("fp8", "fp16:2", "topk:0", "topk:1.5"):
        with pytest.raises(ValueError):
            Compression.parse(bad)
    w = torch.zeros(3)
    assert compression_for({"a": FP16}, "a", w) is FP16
    assert compression_for({"a": FP16}, "b", w) is NONE
    assert compression_for(lambda n, p: BF16, "a", w) is BF16
    with pytest.raises(TypeError):
        compression_for(lambda n, p: "fp16", "a", w)  # type: ignore[arg-type,return-value]


def test_bf16_bits_are_torch_bfloat16() -> None:
    x = torch.randn(1000) * torch.logspace(-30, 30, 1000)
    bits = bf16_bits(x)
    assert bits.dtype == np.uint16
    # What the daemon widens them to (irdma.narrowing) is torch's bfloat16 exactly.
    back = np.empty(1000, np.float32)
    narrowing.widen_into(bits, WIRE_BFLOAT16, back)
    assert torch.equal(torch.from_numpy(back), x.to(torch.bfloat16).float())


def test_topk_error_feedback_keeps_what_was_not_sent() -> None:
    c = Compression.topk(0.1)
    sel = TopK()
    g1, g2 = torch.randn(50), torch.randn(50)
    idx, values = sel.select("t", c, g1)
    assert len(idx) == 5
    sent = torch.zeros(50)
    sent[torch.from_numpy(idx).long()] = torch.from_numpy(values)
    assert torch.equal(sent + sel.residuals["t"], g1)
    # The next step sends from the gradient plus the residual.
    corrected = g2 + sel.residuals["t"]
    idx2, values2 = sel.select("t", c, g2)
    assert torch.equal(torch.from_numpy(values2), corrected[torch.from_numpy(idx2).long()])
    assert set(idx2.tolist()) == set(torch.topk(corrected.abs(), 5).indices.tolist())
    (back,) = unpack_pairs(pack_pairs([(idx2, values2)]), [5])
    assert np.array_equal(back[0], idx2) and np.array_equal(back[1], values2)


def one_worker(cluster: Cluster, model: torch.nn.Module, **kw) -> DistributedOptimizer:
    client = cluster.client()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    name = kw.pop("name", f"one-{uuid.uuid4().hex[:8]}")
    return DistributedOptimizer(
        opt, model.named_parameters(), client=client, name=name, rank=0, world_size=1, **kw
    )


def test_wrapper_works_with_schedulers_and_checkpoints(cluster: Cluster) -> None:
    model = make_model()
    with one_worker(cluster, model) as opt:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        x, y = batch(0, 0)
        LOSS(model(x), y).backward()
        opt.step()
        sched.step()
        assert opt.optimizer.param_groups[0]["lr"] == 0.05
        state = opt.state_dict()
        assert state == opt.optimizer.state_dict()
        opt.load_state_dict(state)
        assert opt.param_groups is opt.optimizer.param_groups
        with pytest.raises(ValueError, match="closure"):
            opt.step(lambda: 0.0)


def test_a_second_backward_before_step_is_refused(cluster: Cluster) -> None:
    model = make_model()
    with one_worker(cluster, model) as opt:
        x, y = batch(0, 0)
        LOSS(model(x), y).backward()
        with pytest.raises(RuntimeError, match="backward_passes_per_step"):
            LOSS(model(x), y).backward()
        opt.step()  # what was sent is still summed and applied


def test_parameters_must_be_named() -> None:
    model = make_model()
    named = [(n, p) for n, p in model.named_parameters() if n != "fc2.bias"]
    with pytest.raises(ValueError, match="not in named_parameters"):
        DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named, rank=0, world_size=1
        )


def test_a_name_left_by_an_earlier_job_is_reported(cluster: Cluster) -> None:
    name = f"stale-{uuid.uuid4().hex[:8]}"
    model = make_model()
    opt = one_worker(cluster, model, name=name)
    x, y = batch(0, 0)
    LOSS(model(x), y).backward()
    opt.step()
    opt.close(wait_for_peers=False)  # as a crashed job: its tensors stay
    model.zero_grad()
    with one_worker(cluster, model, name=name) as again:
        LOSS(model(x), y).backward()
        with pytest.raises(StepMismatch, match="earlier job"):
            again.step()


# -- the examples, as a user runs them -------------------------------------------------------


@pytest.mark.parametrize("example", ["torch_ddp.py", "torch_optimizer.py"])
def test_examples_run_under_torchrun(cluster: Cluster, tmp_path: Path, example: str) -> None:
    """Two ranks, six epochs: 0.91 (DDP) and 0.96 (Adam). docs/pytorch.md has the full runs."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (the 'train' extra)")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    argv += [str(ROOT / "examples" / example), "--epochs", "6", "--min-accuracy", "0.85"]
    env = dict(os.environ, IRDMA_CONFIG=str(cluster.config_path))
    run = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "test accuracy" in run.stdout
    with Client(cluster.config_path) as c:  # close() removed the job's tensors
        assert not [i.name for i in c.list(".collectives/") if "-torch" in i.name]
