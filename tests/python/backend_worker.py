"""One rank of tests/python/test_backend.py: PyTorch's own torch.distributed
API over the "distopt" backend. Usage: backend_worker.py CASE OUT_DIR
[BACKEND]. Started by `distopt launch -n N` (env:// rendezvous), or by hand
with DISTOPT_TEST_INIT=file://... (then RANK and WORLD_SIZE are set too).
Writes what it computed to OUT_DIR; a failed check exits non-zero."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import distopt  # registers the "distopt" backend
from common import BATCHES, GLOBAL_BATCH, make_model, data

case, out = sys.argv[1], sys.argv[2]
backend = sys.argv[3] if len(sys.argv) > 3 else "distopt"
torch.set_num_threads(1)
init = os.environ.get("DISTOPT_TEST_INIT", "env://")
timeout = datetime.timedelta(seconds=float(os.environ.get("DISTOPT_TEST_TIMEOUT", "120")))
if init.startswith("file://"):
    dist.init_process_group(backend, init_method=init, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
else:
    dist.init_process_group(backend, timeout=timeout)
rank, world = dist.get_rank(), dist.get_world_size()


def expect(cond, what):
    if not cond:
        print(f"rank {rank}: FAILED: {what}", flush=True)
        sys.exit(5)


def same(got, want, what):
    expect(got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want),
           f"{what}: got {got.tolist()} ({got.dtype}), want {want.tolist()} ({want.dtype})")


def contribution(r, dtype, n=6):
    """Rank r's tensor: small values every dtype holds exactly."""
    if dtype == torch.bool:
        return (torch.arange(n) + r) % 2 == 0
    return (torch.arange(n) % 3 + r + 1).to(dtype)


def collectives():
    ops = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT,
           "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX}
    every = [contribution(r, torch.float64) for r in range(world)]
    local = {"SUM": lambda ts: sum(ts), "PRODUCT": lambda ts: torch.stack(ts).prod(0),
             "MIN": lambda ts: torch.stack(ts).amin(0), "MAX": lambda ts: torch.stack(ts).amax(0)}
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8, torch.int8):
        for name, op in ops.items():
            t = contribution(rank, dtype)
            dist.all_reduce(t, op=op)
            same(t, local[name](every).to(dtype), f"all_reduce {name} {dtype}")
    # AVG (a float average), bitwise ops, bool.
    t = contribution(rank, torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    expect(torch.allclose(t, (sum(every) / world).float()), f"AVG: {t.tolist()}")
    ints = [contribution(r, torch.int64) * 5 for r in range(world)]
    for name, fold in (("BAND", torch.bitwise_and), ("BOR", torch.bitwise_or),
                       ("BXOR", torch.bitwise_xor)):
        t = contribution(rank, torch.int64) * 5
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        want = ints[0]
        for x in ints[1:]:
            want = fold(want, x)
        same(t, want, f"all_reduce {name}")
    b = contribution(rank, torch.bool)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    same(b, torch.stack([contribution(r, torch.bool) for r in range(world)]).any(0), "bool MAX")
    # PREMUL_SUM: each contribution times the factor, summed.
    t = contribution(rank, torch.float32)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    expect(torch.allclose(t, (sum(every) * 0.5).float()), f"PREMUL_SUM: {t.tolist()}")
    # Empty and 0-dim tensors.
    e = torch.zeros(0)
    dist.all_reduce(e)
    dist.broadcast(e, src=0)
    expect(e.numel() == 0, "empty tensor")
    sc = torch.tensor(float(rank + 1))
    dist.all_reduce(sc)
    same(sc, torch.tensor(float(sum(range(1, world + 1)))), "0-dim all_reduce")
    # A non-contiguous tensor is reduced in place.
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank
    col = m.t()
    dist.all_reduce(col)
    same(m, (torch.arange(12, dtype=torch.float32).reshape(3, 4) * world +
             sum(range(world))), "non-contiguous all_reduce")
    # all_reduce_coalesced.
    a, c = torch.ones(3) * rank, torch.ones(2, 2) * (rank + 1)
    dist.all_reduce_coalesced([a, c])
    same(a, torch.ones(3) * sum(range(world)), "coalesced a")
    same(c, torch.ones(2, 2) * sum(range(1, world + 1)), "coalesced c")
    # broadcast from the last rank; reduce to rank 1.
    t = torch.full((5,), float(rank))
    dist.broadcast(t, src=world - 1)
    same(t, torch.full((5,), float(world - 1)), "broadcast")
    t = contribution(rank, torch.float32)
    dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
    if rank == 1:
        same(t, local["MAX"](every).float(), "reduce MAX at dst")
    # allgather, all_gather_into_tensor, gather, scatter.
    outs = [torch.zeros(2, 3, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(outs, torch.full((2, 3), rank, dtype=torch.int64))
    for r in range(world):
        same(outs[r], torch.full((2, 3), r, dtype=torch.int64), f"all_gather[{r}]")
    flat = torch.zeros(world * 4)
    dist.all_gather_into_tensor(flat, torch.full((4,), float(rank)))
    same(flat, torch.arange(world).float().repeat_interleave(4), "all_gather_into_tensor")
    gathered = [torch.zeros(3) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((3,), rank + 0.5), gathered, dst=0)
    if rank == 0:
        for r in range(world):
            same(gathered[r], torch.full((3,), r + 0.5), f"gather[{r}]")
    got = torch.zeros(2, 2)
    chunks = [torch.full((2, 2), 10.0 * r) for r in range(world)] if rank == world - 1 else None
    dist.scatter(got, chunks, src=world - 1)
    same(got, torch.full((2, 2), 10.0 * rank), "scatter")
    # reduce_scatter (lists and tensor), native and through the fallback.
    for dtype in (torch.float32, torch.uint8):
        mine = torch.zeros(3, dtype=dtype)
        dist.reduce_scatter(mine, [torch.full((3,), r + rank, dtype=dtype) for r in range(world)])
        same(mine, torch.full((3,), world * rank + sum(range(world)), dtype=dtype),
             f"reduce_scatter {dtype}")
    mine = torch.zeros(2)
    dist.reduce_scatter_tensor(mine, torch.arange(2 * world, dtype=torch.float32) * (rank + 1))
    same(mine, (torch.arange(2 * world).float() * sum(range(1, world + 1)))[2 * rank:2 * rank + 2],
         "reduce_scatter_tensor")
    # all_to_all_single, even and with uneven splits; all_to_all.
    src = torch.arange(world * 2, dtype=torch.float32) + 100 * rank
    dst = torch.zeros(world * 2)
    dist.all_to_all_single(dst, src)
    same(dst, torch.tensor([100.0 * r + 2 * rank + k for r in range(world) for k in range(2)]),
         "all_to_all_single")
    in_splits = [r + 1 for r in range(world)]          # rank sends r+1 rows to rank r
    out_splits = [rank + 1] * world                    # and gets rank+1 rows from each
    src = torch.full((sum(in_splits), 2), float(rank))
    dst = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(dst, src, out_splits, in_splits)
    same(dst, torch.cat([torch.full((rank + 1, 2), float(r)) for r in range(world)]),
         "uneven all_to_all_single")
    outs = [torch.zeros(2, dtype=torch.int32) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((2,), 10 * rank + r, dtype=torch.int32)
                           for r in range(world)])
    for r in range(world):
        same(outs[r], torch.full((2,), 10 * r + rank, dtype=torch.int32), f"all_to_all[{r}]")
    # send / recv in a ring, blocking and isend/irecv; tags keep messages apart.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    a, b = torch.zeros(4), torch.zeros(4)
    reqs = [dist.irecv(b, prv, tag=2), dist.irecv(a, prv, tag=1),
            dist.isend(torch.full((4,), float(rank)), nxt, tag=1),
            dist.isend(torch.full((4,), rank + 0.5), nxt, tag=2)]
    for r in reqs:
        r.wait()
    same(a, torch.full((4,), float(prv)), "irecv tag 1")
    same(b, torch.full((4,), prv + 0.5), "irecv tag 2")
    if rank == 0:
        dist.send(torch.tensor([7, 8], dtype=torch.int64), 1)
    elif rank == 1:
        t = torch.zeros(2, dtype=torch.int64)
        dist.recv(t, 0)
        same(t, torch.tensor([7, 8]), "recv")
    # Objects (pickles over allgather / broadcast).
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
    expect(objs == [{"rank": r, "name": f"r{r}"} for r in range(world)], f"objects {objs}")
    lst = [rank, "x"] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    expect(lst == [1, "x"], f"broadcast_object_list {lst}")
    # Async work: get_future().then() runs without anyone waiting; wait(timeout).
    t = torch.ones(3) * (rank + 1)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    expect(torch.equal(fut.wait(), torch.ones(3) * 2 * sum(range(1, world + 1))), "then()")
    expect(work.wait(datetime.timedelta(seconds=60)), "wait(timeout)")
    expect(work.is_completed(), "work state")
    # A subgroup of ranks 0 and 1 (its own communicator), and a barrier.
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        t = torch.ones(2) * (rank + 1)
        dist.all_reduce(t, group=sub)
        same(t, torch.ones(2) * 3, "subgroup all_reduce")
    dist.barrier()


def train(model, opt, steps=BATCHES, micro=1):
    xs, ys = data()
    half = GLOBAL_BATCH // world
    for step in range(steps):
        x, y = xs[step][rank * half:(rank + 1) * half], ys[step][rank * half:(rank + 1) * half]
        opt.zero_grad()
        if micro == 2:  # gradient accumulation: the first micro-batch under no_sync
            with model.no_sync():
                (F.cross_entropy(model(x[:half // 2]), y[:half // 2]) * 0.5).backward()
            (F.cross_entropy(model(x[half // 2:]), y[half // 2:]) * 0.5).backward()
        else:
            F.cross_entropy(model(x), y).backward()
        opt.step()


def save(model):
    torch.save({n: p.detach() for n, p in model.named_parameters()},
               os.path.join(out, f"params_{rank}.pt"))


def ddp_case():
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(make_model(), bucket_cap_mb=0.001)  # several buckets for a small model
    if case == "ddp_fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if case == "ddp_powersgd_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, min_compression_rate=0.5)
        model.register_comm_hook(state, powerSGD.powerSGD_hook)
    if case == "ddp_zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if case == "ddp_join":
        # Uneven inputs: rank 0 runs one step fewer; DDP's join shadows it.
        xs, ys = data()
        half = GLOBAL_BATCH // world
        with model.join():
            for step in range(BATCHES - (1 if rank == 0 else 0)):
                x = xs[step][rank * half:(rank + 1) * half]
                y = ys[step][rank * half:(rank + 1) * half]
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
    else:
        train(model, opt, micro=2 if case == "ddp_no_sync" else 1)
    save(model.module)


def peer_dies():
    t = torch.ones(1000)
    for step in range(5):
        if rank == 1 and step == 2:
            os._exit(9)  # a crash: no goodbye to the peer
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)
            sys.exit(3)


def mismatch():
    try:
        # Rank 1 reduces fewer elements (a rank-dependent shape).
        dist.all_reduce(torch.ones(1000 if rank == 0 else 10))
    except RuntimeError as e:
        print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)
        sys.exit(3)


if case == "collectives":
    collectives()
elif case.startswith("ddp"):
    ddp_case()
elif case == "peer_dies":
    peer_dies()
elif case == "mismatch":
    mismatch()
else:
    sys.exit(f"unknown case {case}")
dist.destroy_process_group()
print(f"rank {rank}: ok", flush=True)
if backend == "gloo":
    # The reference run over gloo: torch 1.13's gloo can abort at interpreter
    # exit after a PowerSGD hook ("Resource deadlock avoided": a thread
    # joining itself), its bug, not the result's; distopt's runs exit normally.
    sys.stdout.flush()
    os._exit(0)
