"""distopt from PyTorch scripts: every algorithm plugin behind an optimizer.

    import distopt
    opt = distopt.DistributedOptimizer(model, "job.yaml")   # or YAML text, or a dict
    for x, y in loader:                                     # this rank's shard
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # buckets are reduced as backward fills them
        opt.step()                        # the job's algorithm: allreduce, zero, fused, ...

`job` has the keys of a `distopt train` job file (communicator, reducer,
algorithm, optimizer with lr_schedule and grad_clip, precision, buffers,
join, ...; the train: section is not used). Rank and world size come from
the launcher's environment (`distopt launch -n N -- python3 train.py`,
torchrun, Slurm, Open MPI), as for a C++ program that embeds the runtime.

Shaped as the originals:
- ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, **defaults):
  PyTorch's, running the `zero` plugin (stage 1; stage=2 shards gradients too);
- fuse_optimizer(optimizer): Bagua's, running the `fused` plugin;
- HybridDeviceOptimizer(params, offload_fraction=0.5, ...): Megatron's,
  running the `hybrid` plugin.
They reduce the gradients themselves: use them without DDP.

Errors from distopt (a bad job, a dead peer, a refused tensor) raise
distopt.Error, whose text names the file and key, or the peer.

A torch.distributed backend: `import distopt` registers "distopt", so a
script written for gloo runs over distopt's communicators by changing the
backend's name (DDP, PyTorch's ZeroRedundancyOptimizer and every
collective work unchanged):

    import distopt, torch.distributed as dist
    dist.init_process_group("distopt")     # env://, tcp://... or a store, as for gloo

CPU tensors go through the `tcp` communicator (shared memory between ranks
on one host), CUDA tensors through `nccl`; set_backend_options() or the
environment (DISTOPT_PG_COMMUNICATOR, DISTOPT_PG_OPTIONS, ...) chooses others.
"""

import atexit
import contextlib
import json
import os

import torch

from . import _distopt
from ._distopt import DistributedOptimizer as _Optimizer
from ._distopt import Error, Runtime

__all__ = [
    "DistributedOptimizer",
    "Error",
    "HybridDeviceOptimizer",
    "Runtime",
    "ZeroRedundancyOptimizer",
    "fuse_optimizer",
    "init",
    "runtime",
    "set_backend_options",
]

_runtime = None
_runtime_job = None


def _job_text(job):
    """(YAML text, name for messages) of a path, YAML text or dict."""
    if isinstance(job, dict):
        return json.dumps(job), "<dict>"  # JSON is YAML
    if isinstance(job, (str, os.PathLike)) and os.path.isfile(job):
        return None, os.fspath(job)
    if isinstance(job, str):
        return job, "<string>"
    raise TypeError(f"distopt: job must be a YAML file, YAML text or a dict, got {type(job)!r}")


def init(job=None):
    """The process's runtime (rendezvous, plugins, communicator), created once.

    `job`: a job file's path, YAML text or a dict (default: the file that
    $DISTOPT_CONFIG names, else a job of every default). Collective: every
    rank calls it. A second call returns the same runtime; with another job
    it raises distopt.Error (one runtime per process).
    """
    global _runtime, _runtime_job
    key = json.dumps(job, sort_keys=True) if isinstance(job, dict) else job
    if _runtime is not None:
        if job is not None and key != _runtime_job:
            raise Error("distopt.init: this process already has a runtime for another job "
                        "(one runtime per process)")
        return _runtime
    if job is None:
        job = os.environ.get("DISTOPT_CONFIG") or {}
    text, name = _job_text(job)
    _runtime = Runtime.from_yaml(name) if text is None else Runtime.from_text(text, name)
    _runtime_job = key
    return _runtime


def runtime():
    """The runtime init() created (None before)."""
    return _runtime


def _named(model_or_params):
    """(named parameters, named buffers) of a module or of an iterable of
    parameters (then named param_0, param_1, ... in order)."""
    if isinstance(model_or_params, torch.nn.Module):
        # A tied parameter once per name, as the model holds it: the C++ side
        # counts it once (first name) and finds its unit from all its holders.
        params = []
        for prefix, mod in model_or_params.named_modules(remove_duplicate=False):
            for n, p in mod._parameters.items():
                if p is not None and p.requires_grad:
                    params.append((f"{prefix}.{n}" if prefix else n, p))
        return params, list(model_or_params.named_buffers())
    params = []
    for i, p in enumerate(model_or_params):
        if isinstance(p, dict):
            raise Error("distopt: parameter groups as dicts are not supported here; pass the "
                        "parameters (per-group settings go in the job's optimizer section)")
        if p.requires_grad:
            params.append((f"param_{i}", p))
    return params, []


def _unit_names(model, units):
    """The units of parameter sharding (module names, none inside another):

    None: every direct child of `model` that holds parameters (FSDP's
    wrapping of a Sequential's layers); a number N: the smallest submodules
    that hold at least N parameters not held by a smaller unit (FSDP's
    size_based_auto_wrap_policy; the parameters of no such module stay
    whole); an iterable of module names and/or module classes: those
    submodules, and every submodule of those classes (FSDP's
    ModuleWrapPolicy), the outermost where they nest. [] for a parameter
    list."""
    if not isinstance(model, torch.nn.Module):
        if units:
            raise Error("distopt: units need a torch.nn.Module model")
        return []
    if units is None:
        return [n for n, c in model.named_children() if any(True for _ in c.parameters())]
    if isinstance(units, (int, float)) and not isinstance(units, bool):
        return _units_by_size(model, int(units))
    names, classes = [], []
    for u in units:
        if isinstance(u, type) and issubclass(u, torch.nn.Module):
            classes.append(u)
        elif isinstance(u, str):
            model.get_submodule(u)  # AttributeError naming it when missing
            names.append(u)
        else:
            raise Error(f"distopt: units: {u!r} is neither a module name nor a module class")
    if classes:
        for n, m in model.named_modules():
            if n and isinstance(m, tuple(classes)) and any(True for _ in m.parameters()):
                names.append(n)
    outer = []  # the outermost of nested names, in model order
    for n in sorted(set(names), key=lambda n: (n.count("."), n)):
        if not any(n.startswith(o + ".") for o in outer):
            outer.append(n)
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    return sorted(outer, key=lambda n: order.get(n, -1))


def _units_by_size(model, min_params):
    """Post-order: a submodule whose parameters not in a smaller unit reach
    min_params becomes a unit; modules around a unit never do (units do not
    nest here), so what they hold outside it stays whole."""
    if min_params < 1:
        raise Error(f"distopt: units: a parameter count must be >= 1, not {min_params}")
    units, seen = [], set()

    def visit(prefix, module):
        """(parameters not in a unit below, whether a unit is below)."""
        free, below = 0, False
        for name, child in module.named_children():
            f, b = visit(f"{prefix}.{name}" if prefix else name, child)
            free += f
            below = below or b
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                free += p.numel()
        if prefix and not below and free >= min_params:
            units.append(prefix)
            return 0, True
        return free, below

    visit("", model)
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    return sorted(units, key=lambda n: order[n])


def _grad_output(out):
    """The first tensor of a forward's output that needs a gradient, or None."""
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad else None
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _grad_output(o)
            if t is not None:
                return t
    if isinstance(out, dict):
        return _grad_output(list(out.values()))
    return None


class DistributedOptimizer:
    """The job's distributed optimizer over `model`'s parameters.

    model: a torch.nn.Module (its named parameters and buffers: checkpoints
    and consolidate use their names) or an iterable of parameters.
    job: a YAML file, YAML text or a dict with the keys of a job file
    (see init()). Collective: every rank builds it; rank 0's parameters and
    buffers are broadcast first, so all ranks start equal.
    units: with `algorithm: {name: zero, options: {stage: 3}}`, the
    submodules whose parameters are gathered as one piece around their
    forward and backward: default, every direct child of `model` that holds
    parameters; a number N, the smallest submodules holding at least N
    parameters (FSDP's size_based_auto_wrap_policy); or module names and/or
    module classes, e.g. units={TransformerBlock} (FSDP's ModuleWrapPolicy).
    Between steps their parameters are empty tensors: read them inside
    gather_params().
    """

    def __init__(self, model, job=None, units=None):
        self.runtime = init(job)
        params, buffers = _named(model)
        if not params:
            raise Error("distopt: no parameter that requires a gradient")
        self._params = list({id(p): p for _, p in params}.values())
        unit_names = _unit_names(model, units)
        self._opt = _Optimizer(self.runtime, params, buffers, unit_names)
        self._hooks = []
        if self._opt.shards_parameters:
            # zero stage 3: each unit gathers its parameters around its forward
            # (and, through a hook on its output, before its backward).
            for i, name in enumerate(unit_names):
                mod = model.get_submodule(name)
                self._hooks.append(mod.register_forward_pre_hook(
                    lambda m, inp, i=i: self._opt.unit_before(i)))
                self._hooks.append(mod.register_forward_hook(
                    lambda m, inp, out, i=i: self._opt.unit_after(i, _grad_output(out))))

    @contextlib.contextmanager
    def gather_params(self):
        """zero stage 3: every unit's full parameters present inside (read,
        evaluate or save the model); each rank's shards stay what it steps.
        Collective. A no-op without parameter sharding."""
        self._opt.enter_gather()
        try:
            yield
        finally:
            self._opt.exit_gather()

    # ---- as torch.optim.Optimizer ----
    def zero_grad(self, set_to_none=False):
        """Zero the gradients (they are views into the buckets, so never None)."""
        del set_to_none
        self._opt.zero_grad()

    def step(self, closure=None):
        """Finish the gradient reduction and run the algorithm's step. Collective."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._opt.step()
        return loss

    @property
    def lr(self):
        """Parameter group 0's learning rate (the schedule's base with a schedule)."""
        return self._opt.lr(0)

    @lr.setter
    def lr(self, value):
        self._opt.set_lr(float(value), 0)

    def set_lr(self, lr, group=0):
        self._opt.set_lr(float(lr), group)

    # ---- as DDP ----
    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: backward passes inside only accumulate; the
        next backward outside sends the sum (scale each loss by 1/K)."""
        self._opt.enter_no_sync()
        try:
            yield
        finally:
            self._opt.exit_no_sync()

    def join(self):
        """Uneven inputs: call after this rank's last step; returns when every
        rank has joined (needs `join: {enabled: true}` in the job)."""
        return self._opt.join()

    # ---- mixed precision ----
    def scale_loss(self, loss):
        """The loss times the current loss scale (1 without mixed precision)."""
        return self._opt.scale_loss(loss)

    @property
    def loss_scale(self):
        return self._opt.loss_scale

    # ---- checkpoints ----
    def save_checkpoint(self, dir, extra=None, keep=2):
        """A sharded checkpoint in `dir` (any world size and algorithm restores
        it; `distopt checkpoint consolidate` makes one file). Collective."""
        return self._opt.save_checkpoint(os.fspath(dir), {k: str(v) for k, v in (extra or {}).items()},
                                         keep)

    def load_checkpoint(self, dir):
        """Restore the newest checkpoint in `dir` (or a step directory). Collective."""
        return self._opt.load_checkpoint(os.fspath(dir))

    def consolidate(self, to=0):
        """Every tensor of the model and the optimizer whole on rank `to`
        ("model/<name>", "algorithm/<key>", ...); {} elsewhere. Collective."""
        return self._opt.consolidate(to)

    # ---- figures ----
    @property
    def steps(self):
        return self._opt.steps

    @property
    def bytes_sent(self):
        return self._opt.bytes_sent

    @property
    def state_bytes(self):
        """Optimizer state held by this rank, bytes (1/N of it under zero)."""
        return self._opt.state_bytes

    @property
    def algorithm(self):
        return self._opt.algorithm

    @property
    def reducer(self):
        return self._opt.reducer


_OPTIMIZER_NAMES = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adamw",
    torch.optim.Adagrad: "adagrad",
    torch.optim.RMSprop: "rmsprop",
}

# PyTorch's argument names -> the job's, where they differ.
_RENAMED = {"betas": ("beta1", "beta2")}
# PyTorch arguments with no effect on the update that distopt applies.
_IGNORED = {"foreach", "maximize", "capturable", "differentiable", "fused"}


def _optimizer_section(optimizer_class, defaults):
    name = _OPTIMIZER_NAMES.get(optimizer_class)
    if name is None:
        known = ", ".join(c.__name__ for c in _OPTIMIZER_NAMES)
        raise Error(f"distopt: optimizer_class {getattr(optimizer_class, '__name__', optimizer_class)} "
                    f"has no libtorch counterpart here (known: {known})")
    section = {"name": name}
    for k, v in defaults.items():
        if k in _IGNORED:
            if v not in (None, False):
                raise Error(f"distopt: {optimizer_class.__name__}({k}={v!r}) is not supported")
            continue
        if k in _RENAMED:
            for new, x in zip(_RENAMED[k], v):
                section[new] = float(x)
        else:
            section[k] = v
    return section


def _with_common(job, common):
    """`job` (a dict) with the caller's communicator etc. from `common`."""
    for k, v in (common or {}).items():
        job[k] = v
    return job


class ZeroRedundancyOptimizer(DistributedOptimizer):
    """PyTorch's ZeroRedundancyOptimizer, running distopt's `zero` plugin:
    each rank keeps 1/N of the optimizer state (stage 1; stage=2 also
    reduce-scatters the gradients). Unlike PyTorch's, it reduces the
    gradients itself: use it without DDP.

    job: further job keys (communicator, reducer, precision, ...) as a dict.
    """

    def __init__(self, params, optimizer_class=torch.optim.Adam, *, stage=1, job=None,
                 **defaults):
        if int(stage) == 3:
            raise Error("distopt.ZeroRedundancyOptimizer: stage 3 shards the parameters of a "
                        "model's units, which a parameter list does not have; use "
                        "distopt.DistributedOptimizer(model, {'algorithm': {'name': 'zero', "
                        "'options': {'stage': 3}}, ...})")
        section = _optimizer_section(optimizer_class, defaults)
        full = _with_common({"algorithm": {"name": "zero", "options": {"stage": int(stage)}},
                             "optimizer": section}, job)
        super().__init__(params, full)


def fuse_optimizer(optimizer, job=None, **options):
    """Bagua's fuse_optimizer: the same update on flat, fused buffers (the
    `fused` plugin) for the parameters and settings of `optimizer` (a
    torch.optim optimizer with one parameter group). Returns the distopt
    optimizer that replaces it."""
    if len(optimizer.param_groups) != 1:
        raise Error("distopt.fuse_optimizer: one parameter group only")
    group = optimizer.param_groups[0]
    settings = {k: v for k, v in group.items() if k != "params" and k in optimizer.defaults}
    section = _optimizer_section(type(optimizer), settings)
    full = _with_common({"algorithm": {"name": "fused", "options": dict(options)},
                         "optimizer": section}, job)
    return DistributedOptimizer(group["params"], full)


class HybridDeviceOptimizer(DistributedOptimizer):
    """Megatron's HybridDeviceOptimizer, running the `hybrid` plugin: the
    update of `offload_fraction` of the parameters runs on the CPU from
    host copies, the rest on the parameters' device."""

    def __init__(self, params, offload_fraction=0.5, optimizer_class=torch.optim.Adam, *,
                 job=None, **defaults):
        section = _optimizer_section(optimizer_class, defaults)
        full = _with_common({"algorithm": {"name": "hybrid",
                                           "options": {"offload_fraction": float(offload_fraction)}},
                             "optimizer": section}, job)
        super().__init__(params, full)


# ---- the torch.distributed backend "distopt" ----

_backend_options = {}


def _option_text(value):
    """Communicator options as YAML/JSON text (a dict, a string, or None)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def set_backend_options(communicator=None, options=None, cuda_communicator=None,
                        cuda_options=None, plugin_paths=None, collective_check_s=None):
    """What the process groups created afterwards by
    dist.init_process_group("distopt") / dist.new_group(backend="distopt") run on.

    communicator: the plugin for CPU tensors (default "tcp"; or "ucx", or
    your own), options: its options as a dict or YAML text (the keys of a
    job file's communicator.options); cuda_communicator / cuda_options: the
    same for CUDA tensors (default "nccl"); plugin_paths: extra plugin
    directories; collective_check_s: after how long a stalled collective
    makes the ranks compare what they wait on (0: off). Arguments left None
    keep their value, which comes from the environment when never set:
    DISTOPT_PG_COMMUNICATOR, DISTOPT_PG_OPTIONS, DISTOPT_PG_CUDA_COMMUNICATOR,
    DISTOPT_PG_CUDA_OPTIONS, DISTOPT_PLUGIN_PATH.
    """
    given = {"communicator": communicator, "options": options,
             "cuda_communicator": cuda_communicator, "cuda_options": cuda_options,
             "plugin_paths": plugin_paths, "collective_check_s": collective_check_s}
    _backend_options.update({k: v for k, v in given.items() if v is not None})


def _current_backend_options():
    o = _distopt.BackendOptions()
    env = os.environ
    o.communicator = _backend_options.get("communicator",
                                          env.get("DISTOPT_PG_COMMUNICATOR") or "tcp")
    o.options = _option_text(_backend_options.get("options", env.get("DISTOPT_PG_OPTIONS")))
    o.cuda_communicator = _backend_options.get(
        "cuda_communicator", env.get("DISTOPT_PG_CUDA_COMMUNICATOR") or "nccl")
    o.cuda_options = _option_text(_backend_options.get("cuda_options",
                                                       env.get("DISTOPT_PG_CUDA_OPTIONS")))
    o.plugin_paths = [os.fspath(p) for p in _backend_options.get("plugin_paths", [])]
    if "collective_check_s" in _backend_options:
        o.collective_check_s = float(_backend_options["collective_check_s"])
    return o


def _create_process_group(store, rank, world_size, timeout):
    """torch.distributed's creator for the "distopt" backend."""
    return _distopt.create_process_group(store, rank, world_size, timeout,
                                         _current_backend_options())


def _register_backend():
    import torch.distributed as dist
    if not dist.is_available() or "DISTOPT" in getattr(dist.Backend, "_plugins", {}):
        return
    try:  # PyTorch >= 2.2: the devices it serves
        dist.Backend.register_backend("distopt", _create_process_group, devices=["cpu", "cuda"])
    except TypeError:
        dist.Backend.register_backend("distopt", _create_process_group)


_register_backend()
# At exit, before Python stops threads that take the GIL: let the process
# groups' Future completions (which free tensors) finish.
atexit.register(_distopt.drain_callbacks)
