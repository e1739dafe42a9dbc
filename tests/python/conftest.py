"""Shared set-up of the Python package's tests."""

import os

import torch.distributed as dist


def _torch_lacks_libuv():
    """PyTorch >= 2.4 makes env:// and torchrun's stores libuv-based unless
    USE_LIBUV=0; a PyTorch built without libuv (Debian's 2.x) then refuses
    every rendezvous, gloo's too. True where that happens."""
    try:
        store = dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)
    except TypeError:  # PyTorch < 2.2: no use_libuv, no libuv default
        return False
    except RuntimeError as e:
        return "libuv" in str(e)
    del store
    return False


def pytest_configure(config):
    # The ranks the tests start inherit it (PyTorch's own switch).
    if "USE_LIBUV" not in os.environ and _torch_lacks_libuv():
        os.environ["USE_LIBUV"] = "0"
