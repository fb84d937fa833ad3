"""model.recompute=offload: each block is recomputed in the backward pass (as recompute=all), and
its checkpointed input, the residual stream entering it ((B, T, C) or packed (N, C)), waits in host
memory between the forward and the backward (Arctic Long Sequence Training, arXiv 2506.13996), so
the device holds no per-layer activation at all. The last block's input stays on the device: the
backward needs it first.

How: torch.utils.checkpoint (non-reentrant) saves its tensor arguments as autograd saved tensors
BEFORE it installs its own saved-tensor hooks for the block's insides, so a saved_tensors_hooks
context around the checkpoint call sees the block input and nothing of the block's insides.
Its pack hook copies the input to a host buffer and keeps only that copy (the device storage is
freed once the caller drops it); its unpack hook, which checkpoint calls once when it starts
recomputing the block, returns the input on the device again, and autograd re-attaches that
tensor to the original graph (grad_fn, requires_grad), so the gradient w.r.t. the block input,
the replayed RNG (dropout) and autocast are exactly those of recompute=all. The block input stays
a tensor argument of checkpoint, which is where checkpoint looks for the devices whose RNG state
to stash: hiding it in a wrapper object would lose the CUDA RNG replay. When block i's recompute
starts, block i-1's input is fetched back (one layer ahead), overlapping block i's work. The
AttentionContext (rotary tables, a packed batch's cu_seqlens: document masking) is no saved
tensor: one object that every block's checkpoint holds by reference, it stays on the device.

Host buffers are reused from step to step (HostBuffers): a buffer is lent to one block input and
comes back when autograd frees that saved tensor (after the backward, or with the graph), so a
second forward before a backward never overwrites a buffer still waited on.

On CUDA (CudaStreamCopies) the copies run on one side stream, asynchronously, into pinned
buffers, without a host sync; elsewhere (PlainCopies: CPU, the tests) they are plain copies.
Everything else (which input, when fetched back, when released) is the same code on both, and
the CPU tests check it. The stream code has no CPU check: the sm_90 stand-in driver the tests use
compiles Triton kernels but has no CUDA runtime to create streams, events or pinned memory.
"""

from __future__ import annotations

import weakref

import torch
from torch.autograd.graph import saved_tensors_hooks


class PlainCopies:
    """Synchronous copies: what a CPU (the tests) or a device without CUDA streams does."""

    pin_memory = False

    def to_host(self, x: torch.Tensor, host: torch.Tensor) -> None:
        host.copy_(x)

    def to_device(self, host: torch.Tensor, device: torch.device):
        """(a new tensor on `device` with host's values, the event to wait for: None)."""
        return host.to(device, copy=True), None

    def wait(self, ready) -> None:
        pass


class CudaStreamCopies:
    """Asynchronous copies on ONE side stream, so the compute stream never waits for a transfer
    it does not need. Because both directions share the stream, a buffer's next device->host copy
    (next step's forward) is ordered after this step's host->device copy out of it: a host buffer
    is never overwritten before the backward read it. No call here syncs the host."""

    pin_memory = True

    def __init__(self, device: torch.device):
        self.side = torch.cuda.Stream(device=device)

    def to_host(self, x: torch.Tensor, host: torch.Tensor) -> None:
        self.side.wait_stream(torch.cuda.current_stream(x.device))  # x is written by queued work
        with torch.cuda.stream(self.side):
            host.copy_(x, non_blocking=True)
        x.record_stream(self.side)  # the allocator keeps x's memory until the copy has run

    def to_device(self, host: torch.Tensor, device: torch.device):
        """(a new device tensor being filled from host on the side stream, its ready event)."""
        current = torch.cuda.current_stream(device)
        x = torch.empty(host.shape, dtype=host.dtype, device=device)
        # x's memory may be a freed tensor's that work queued on the compute stream still uses
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            x.copy_(host, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.side)
        x.record_stream(self.side)  # dropped unused, x's memory stays out of reach until then
        return x, ready

    def wait(self, ready) -> None:
        torch.cuda.current_stream(self.side.device).wait_event(ready)


class HostBuffers:
    """Flat host tensors lent to block inputs and given back when those are released; a lent
    buffer holds any input of its dtype with at most its number of elements, so steady-state steps
    allocate nothing, and packed inputs whose token count varies reuse the same buffers."""

    def __init__(self):
        self.free: list[torch.Tensor] = []  # flat (numel,) tensors not lent now

    def take(self, shape: torch.Size, dtype: torch.dtype, pin_memory: bool) -> torch.Tensor:
        """A flat host tensor of `dtype` with at least prod(shape) elements (view it as shape)."""
        numel = shape.numel()
        fits = [b for b in self.free if b.dtype == dtype and b.numel() >= numel]
        if fits:
            buffer = min(fits, key=torch.Tensor.numel)
            self.free = [b for b in self.free if b is not buffer]
            return buffer
        # none fits: the free ones are of an older, smaller shape (or another dtype) and would
        # never be taken again. (Pinned memory freed while a copy is in flight is safe: torch's
        # host allocator records the copies' streams and waits for them before reusing it.)
        self.free = []
        return torch.empty(numel, dtype=dtype, pin_memory=pin_memory)

    def give(self, buffer: torch.Tensor) -> None:
        self.free.append(buffer)


class BlockInput:
    """One block's checkpointed input between its forward and its recompute: on the host
    (offloaded) or kept on the device (the last block). `previous`: the block before it in the
    same forward pass, fetched back when this one is unpacked."""

    def __init__(
        self,
        x: torch.Tensor,
        index: int,
        previous: BlockInput | None,
        offload: BlockInputOffload,
        to_host: bool,
    ):
        self.index, self.previous = index, previous
        self.device = x.device
        self._copies, self._buffers = offload.copies(x.device), offload.buffers
        self._ready = None  # the event the device copy is ready at (CUDA)
        self._buffer = None  # the flat host buffer lent to this input
        if to_host:
            self._buffer = self._buffers.take(x.shape, x.dtype, self._copies.pin_memory)
            self.host = self._buffer[: x.numel()].view(x.shape)
            with torch.no_grad():
                self._copies.to_host(x, self.host)
            self.on_device = None
        else:
            self.host, self.on_device = None, x.detach()

    def prefetch(self) -> None:
        """Start bringing the input back to the device (no-op if it is there or on its way)."""
        if self.on_device is None:
            self.on_device, self._ready = self._copies.to_device(self.host, self.device)

    def unpack(self) -> torch.Tensor:
        """The input on the device, for the block's recompute; starts the previous block's."""
        self.prefetch()
        x = self.on_device
        self._copies.wait(self._ready)
        if self.host is not None:  # the recompute holds it now; the host copy stays for a
            self.on_device, self._ready = None, None  # second backward (retain_graph)
        if self.previous is not None:
            self.previous.prefetch()
        return x

    def __del__(self):
        # autograd released the saved input (backward done, or the graph dropped): the buffer can
        # take the next forward's input (CUDA: the side stream orders that copy after ours)
        if self._buffer is not None:
            self._buffers.give(self._buffer)
            self._buffer = None


class BlockInputOffload:
    """A model's offload state across steps: the host buffers and the copy engine per device.
    Copying or pickling the model gives a fresh, empty one (buffers and streams do not travel)."""

    def __init__(self):
        self.buffers = HostBuffers()
        self._copies: dict[torch.device, PlainCopies | CudaStreamCopies] = {}

    def copies(self, device: torch.device) -> PlainCopies | CudaStreamCopies:
        if device not in self._copies:
            cuda = device.type == "cuda"
            self._copies[device] = CudaStreamCopies(device) if cuda else PlainCopies()
        return self._copies[device]

    def forward_pass(self) -> OffloadedForward:
        """The bookkeeping of one forward pass through the blocks (which input came before)."""
        return OffloadedForward(self)

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


class OffloadedForward:
    """One forward pass: `saving_input(x, to_host)` around each block's checkpoint call."""

    def __init__(self, offload: BlockInputOffload):
        self.offload = offload
        self.count = 0
        self.last: BlockInput | None = None

    def saving_input(self, x: torch.Tensor, to_host: bool) -> saved_tensors_hooks:
        """Hooks that turn the checkpoint's saved block input x into a BlockInput (to_host:
        offloaded). Any other tensor saved under them is kept as it is: older torch versions'
        checkpoint saves a 0-element placeholder next to the inputs."""
        # autograd keeps both hooks as long as the saved input: they hold nothing strongly (not
        # x, not this forward's chain of BlockInputs), so each input lives as long as its block's
        # graph, as under recompute=all
        key, forward = (x.data_ptr(), x.shape, x.dtype), weakref.ref(self)

        def pack(t: torch.Tensor) -> BlockInput | torch.Tensor:
            if (t.data_ptr(), t.shape, t.dtype) != key:
                return t
            return forward().add(t, to_host)

        return saved_tensors_hooks(pack, _unpack)

    def add(self, x: torch.Tensor, to_host: bool) -> BlockInput:
        """The next block's input, saved (to_host: offloaded)."""
        self.last = BlockInput(x, self.count, self.last, self.offload, to_host)
        self.count += 1
        return self.last


def _unpack(saved: BlockInput | torch.Tensor) -> torch.Tensor:
    return saved.unpack() if isinstance(saved, BlockInput) else saved
