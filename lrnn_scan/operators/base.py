"""The transition-operator protocol every scan in lrnn_scan is written against.

A *transition operator* is a batch of linear maps ``A`` acting on a state. Every operator has a
``batch_shape`` (the leading dims of its parameter tensors, time included, e.g. ``(B, T, H)``) and
a ``state_size`` ``d``. It acts on

* vector states ``x`` of shape ``(*batch_shape, d)``, or
* matrix states ``X`` of shape ``(*batch_shape, d, c)`` (columns transformed independently, as the
  ``d_k x d_v`` state of DeltaNet: ``H_t = A_t H_{t-1} + B_t``).

The scan element is the pair ``(A_t, b_t)`` and the combine (earlier ``i``, later ``j``) is
``(A_j A_i, A_j b_i + b_j)`` (``shared/reference/math.md`` §1). An operator therefore needs:

=================  ==========================================================================
``apply(x)``       ``A x`` (batched, broadcasting over ``batch_shape``)
``compose(e)``     ``self ∘ e`` = ``A_self @ A_e``: ``self`` is the *later* step. May return an
                   operator of another family (a companion times a companion is a dense block).
``transpose()``    ``A^T`` (for the adjoint scan of the gradients).
``identity_like()`` an operator with the same ``batch_shape`` acting as the identity.
``to_dense()``     the ``(*batch_shape, d, d)`` matrix.
``tensors()``      the parameter tensors, each with leading dims ``batch_shape``; together with
``with_tensors()`` rebuilds the operator from new tensors (same non-tensor configuration).
=================  ==========================================================================

Everything else (slicing along time, flipping, gathering for variable-length batches) is derived
from ``tensors()``/``with_tensors()`` because every parameter tensor starts with ``batch_shape``.
Gradients of the parameters come for free: the scan's backward computes them as the vector-Jacobian
product of ``params -> op.apply(h_{t-1})`` with the adjoint ``λ_t`` (math.md §4); an operator may
override :meth:`TransitionOperator.param_grads` with a closed form (the four built-in families
do: it is faster, and the generic one is a nested ``torch.autograd.grad`` that ``torch.compile``
traces only with ``trace_autograd_ops`` and torch 2.11's Dynamo not at all).
:func:`lrnn_scan.testing.check_operator_laws` checks an override against the generic form.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["TransitionOperator", "compose", "dense_compose", "promote_to_dense"]


class TransitionOperator(ABC):
    """Base class of all transition operators (see the module docstring for the protocol).

    Subclasses set ``tensor_fields`` (names of the parameter tensors, in the order ``tensors()``
    returns them) and implement ``state_size``, ``_apply_matrix``, ``compose``, ``transpose``,
    ``identity_like`` and ``to_dense``. Non-tensor configuration (flags, eps) is kept in
    attributes listed in ``config_fields`` and is carried over by :meth:`with_tensors`.
    """

    tensor_fields: tuple[str, ...] = ()
    config_fields: tuple[str, ...] = ()

    # ----------------------------------------------------------------------------- structure
    def tensors(self) -> tuple[Tensor, ...]:
        """The parameter tensors, each of shape ``(*batch_shape, ...)``."""
        return tuple(getattr(self, f) for f in self.tensor_fields)

    def config(self) -> dict:
        return {f: getattr(self, f) for f in self.config_fields}

    def with_tensors(self, *tensors: Tensor) -> "TransitionOperator":
        """A new operator of the same class and configuration built from ``tensors``.

        Constructors are bypassed (no validation), so this is cheap inside scans.
        """
        if len(tensors) != len(self.tensor_fields):
            raise ValueError(f"{type(self).__name__}.with_tensors: expected {len(self.tensor_fields)} "
                             f"tensors {self.tensor_fields}, got {len(tensors)}")
        new = object.__new__(type(self))
        for f, t in zip(self.tensor_fields, tensors):
            setattr(new, f, t)
        for f, v in self.config().items():
            setattr(new, f, v)
        new._batch_ndim = self._batch_ndim
        return new

    def map(self, fn: Callable[[Tensor], Tensor]) -> "TransitionOperator":
        """Apply ``fn`` to every parameter tensor.

        ``fn`` must keep the number of batch dims (index, flip, cast, gather along a batch dim);
        to add or drop batch dims build a new operator from the new tensors instead.
        """
        return self.with_tensors(*(fn(t) for t in self.tensors()))

    @property
    def batch_shape(self) -> torch.Size:
        return self.tensors()[0].shape[: self._batch_ndim]

    @property
    def batch_ndim(self) -> int:
        return self._batch_ndim

    @property
    @abstractmethod
    def state_size(self) -> int:
        """``d``: the size of the vector the blocks act on (a class attribute is fine too)."""

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors()[0].dtype

    @property
    def device(self) -> torch.device:
        return self.tensors()[0].device

    def __repr__(self) -> str:
        shapes = ", ".join(f"{f}={tuple(t.shape)}" for f, t in zip(self.tensor_fields, self.tensors()))
        cfg = "".join(f", {k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({shapes}{cfg}, dtype={self.dtype})"

    # ----------------------------------------------------------------------------- algebra
    def apply(self, x: Tensor) -> Tensor:
        """``A x`` for a vector state ``(*batch, d)`` or a matrix state ``(*batch, d, c)``."""
        nb = self._batch_ndim
        if x.dim() == nb + 1:
            return self._apply_matrix(x.unsqueeze(-1)).squeeze(-1)
        if x.dim() == nb + 2:
            return self._apply_matrix(x)
        raise ValueError(f"{type(self).__name__}.apply: x must have shape (*batch_shape, d) or "
                         f"(*batch_shape, d, c) with batch_shape={tuple(self.batch_shape)}, "
                         f"d={self.state_size}; got {tuple(x.shape)}")

    @abstractmethod
    def _apply_matrix(self, x: Tensor) -> Tensor:
        """``A @ x`` for ``x`` of shape ``(*batch_shape, d, c)``."""

    def compose(self, earlier: "TransitionOperator") -> "TransitionOperator":
        """``self @ earlier`` (``self`` acts after ``earlier``). Default: dense promotion."""
        return dense_compose(self, earlier)

    @abstractmethod
    def transpose(self) -> "TransitionOperator":
        """``A^T`` (any family; the adjoint scan runs over it)."""

    @abstractmethod
    def identity_like(self) -> "TransitionOperator":
        """An operator with this ``batch_shape`` acting as the identity (any family)."""

    @abstractmethod
    def to_dense(self) -> Tensor:
        """The ``(*batch_shape, d, d)`` matrices."""

    # ----------------------------------------------------------------------------- gradients
    def param_grads(self, x: Tensor, cotangent: Tensor) -> tuple[Tensor | None, ...]:
        """Gradients of ``<cotangent, self.apply(x)>`` w.r.t. each parameter tensor.

        Generic: one batched vector-Jacobian product through :meth:`apply` (no loop over time).
        ``x`` and ``cotangent`` are states of shape ``(*batch_shape, d[, c])``.
        """
        params = [t.detach().requires_grad_(t.is_floating_point()) for t in self.tensors()]
        with torch.enable_grad():
            y = self.with_tensors(*params).apply(x.detach())
            needs = [p for p in params if p.requires_grad]
            grads = torch.autograd.grad(y, needs, cotangent, allow_unused=True)
        it = iter(grads)
        out = []
        for p in params:
            if not p.requires_grad:
                out.append(None)
                continue
            g = next(it)
            out.append(torch.zeros_like(p) if g is None else g)
        return tuple(out)

    # ----------------------------------------------------------------------------- helpers
    def select_time(self, dim: int, index: Tensor | slice | int) -> "TransitionOperator":
        """Index every parameter tensor along batch dim ``dim`` (keeps the dim for ints)."""
        if isinstance(index, int):
            return self.map(lambda t: t.narrow(dim, index, 1))
        if isinstance(index, slice):
            sl = (slice(None),) * dim + (index,)
            return self.map(lambda t: t[sl])
        return self.map(lambda t: t.index_select(dim, index))


def promote_to_dense(op: TransitionOperator) -> "TransitionOperator":
    """The same operator as a :class:`~lrnn_scan.BlockDiagonal` with dense ``d x d`` blocks."""
    from .block_diagonal import BlockDiagonal

    if isinstance(op, BlockDiagonal):
        return op
    return BlockDiagonal._from_dense(op.to_dense(), op.batch_ndim)


def compose(later: TransitionOperator, earlier: TransitionOperator) -> TransitionOperator:
    """``later @ earlier`` for any two operators with broadcast-compatible batch shapes.

    Same-family products use the family's own rule (:meth:`TransitionOperator.compose`); mixed
    products promote both sides to dense blocks (the smallest family closed under the combine for
    all built-ins), so e.g. ``compose(Diagonal(a), HouseholderProduct(k, beta))`` is well defined.
    """
    if not isinstance(later, TransitionOperator) or not isinstance(earlier, TransitionOperator):
        raise TypeError(f"compose: expected two TransitionOperators, got {type(later).__name__} "
                        f"and {type(earlier).__name__}")
    if later.state_size != earlier.state_size:
        raise ValueError(f"compose: state sizes differ: later has d={later.state_size}, "
                         f"earlier has d={earlier.state_size}")
    if later.dtype != earlier.dtype:
        raise TypeError(f"compose: dtypes differ: later is {later.dtype}, earlier is {earlier.dtype}")
    if type(later) is type(earlier):
        return later.compose(earlier)
    return dense_compose(later, earlier)


def dense_compose(later: TransitionOperator, earlier: TransitionOperator) -> TransitionOperator:
    """``later @ earlier`` as dense blocks (:class:`~lrnn_scan.BlockDiagonal`)."""
    from .block_diagonal import BlockDiagonal

    dl, de = later.to_dense(), earlier.to_dense()
    nb = max(later.batch_ndim, earlier.batch_ndim)
    return BlockDiagonal._from_dense(dl @ de, nb)


def check_batch_tensor(name: str, t, min_dims: int, trailing: Sequence[int | None] = (),
                       what: str = "") -> Tensor:
    """Validate a parameter tensor's type, rank and trailing sizes; raise a clear error."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{what}, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must have a real floating dtype (float16/bfloat16/float32/"
                        f"float64), got {t.dtype}")
    if t.dim() < min_dims:
        raise ValueError(f"{name} must have at least {min_dims} dims{what}, got shape {tuple(t.shape)}")
    for i, size in enumerate(reversed(trailing)):
        if size is not None and t.shape[-1 - i] != size:
            raise ValueError(f"{name}{what}: dim {t.dim() - 1 - i} must be {size}, got shape "
                             f"{tuple(t.shape)}")
    return t


def check_same(name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    """dtype/device agreement between two tensors, with a clear error."""
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}; "
                        f"they must match")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; "
                         f"they must be on the same device")
