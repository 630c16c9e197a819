"""Eight float64 lanes as one LLVM vector, for kernels that run eight small independent problems side by side.

A value of type :data:`f64x8` is an LLVM ``<8 x double>`` (one 512-bit register, or two
256-bit ones where the CPU has no AVX-512). The intrinsics below load and store the last
axis of a C-contiguous float64 array (``arr[i, j, 0:8]``; :func:`vload` also reads float32, widened: exact) and do
the arithmetic
lane by lane: :func:`vfma`, :func:`vfnma` (and :func:`vfma1` on scalars) are fused multiply-adds
(``llvm.fma``, one rounding, on every CPU), the rest IEEE operations, so a lane's bits depend only on its own
inputs and the order the caller wrote: not on the other lanes, the vector width or ``fastmath``.

Why not plain loops over the eight lanes: Numba runs LLVM's loop vectorizer but not its SLP
vectorizer (``NUMBA_SLP_VECTORIZE=0`` by default), and a loop of a constant eight is fully
unrolled before the loop vectorizer sees it, so such loops compile to scalar code (a batched
9 x 9 Cholesky: 140-190 ns per system as loops, about 45 ns with these; docs/benchmarks.md).
Used by :func:`streamdp.kernels.linalg.chol_solve_lanes` (eight users' Cholesky solves) and
``linalg._gram_rows`` (a user's 8 x 8 or 9 x 9 Gramian in column vectors).
"""

from __future__ import annotations

import llvmlite.binding as _llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

#: Lanes per vector.
LANES = 8
_VT = ir.VectorType(ir.DoubleType(), LANES)


class F64x8(types.Type):
    """Eight float64 lanes (an LLVM ``<8 x double>``)."""

    def __init__(self):
        super().__init__(name="F64x8")


#: The Numba type of eight lanes.
f64x8 = F64x8()


@register_model(F64x8)
class _F64x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VT)


def _lanes_pointer(context, builder, sig, args, vt=_VT):
    """``&arr[idx..., 0]`` as a pointer to eight lanes of ``vt`` (``idx`` one index per axis but the last, non-negative
    and in range, the last axis contiguous and at least 8 long: the caller's to ensure, no checks)."""
    aryty, idxty = sig.args[0], sig.args[1]
    ary = context.make_array(aryty)(context, builder, args[0])
    inds = [context.cast(builder, v, t, types.intp)
            for v, t in zip(cgutils.unpack_tuple(builder, args[1], count=len(idxty)), idxty)]
    p = cgutils.get_item_pointer(context, builder, aryty, ary, inds + [context.get_constant(types.intp, 0)])
    return builder.bitcast(p, vt.as_pointer())


def _check_array(arr, idx, dtypes=(types.float64,)):
    if not (isinstance(arr, types.Array) and arr.dtype in dtypes
            and isinstance(idx, types.BaseTuple) and len(idx) == arr.ndim - 1
            and all(isinstance(t, types.Integer) for t in idx)):
        raise TypeError(f"lanes of a {' or '.join(map(str, dtypes))} array by a tuple of {arr} 's leading indices, "
                        f"not {idx}")


_VT32 = ir.VectorType(ir.FloatType(), LANES)


@intrinsic
def vload(typingctx, arr, idx):
    """``arr[*idx, 0:8]`` of a float64 array, or of a float32 one widened to float64 (exact)."""
    _check_array(arr, idx, (types.float64, types.float32))

    def codegen(context, builder, sig, args):
        if sig.args[0].dtype == types.float32:
            return builder.fpext(builder.load(_lanes_pointer(context, builder, sig, args, _VT32), align=4), _VT)
        return builder.load(_lanes_pointer(context, builder, sig, args), align=8)
    return f64x8(arr, idx), codegen


#: How many pairs ahead a loop over a block's pairs asks for the row of a table it will read
#: (:func:`prefetch_row`; the per-user solve at k = 9, :func:`streamdp.kernels.linalg.solve_users_huber`): 4 to 32
#: measured alike. (The item side's right-hand side, which adds into rows of ``B`` as large, ran slower with it:
#: 2.65 -> 2.95 ms a block.)
ROWS_AHEAD = 8


#: ``llvm.prefetch``'s name as this LLVM mangles its pointer argument: opaque pointers (``p0``) from LLVM 15 on, an
#: ``i8*`` (``p0i8``) before (numba 0.60's LLVM 14).
_PREFETCH = "llvm.prefetch.p0" if _llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


@intrinsic
def prefetch_row(typingctx, arr, j):
    """Ask for every 64-byte line of row ``j`` of the 2-D C-contiguous ``arr`` to be fetched into the caches
    (``llvm.prefetch``, a read, kept in every level): a hint, no effect on any result (``j`` in range: the caller's
    to ensure). For a loop whose rows of a table too large for the core's cache come in an order it knows ahead:
    the loads of a later step are asked for while this one computes. Of an array that is not C-contiguous (a
    kernel compiled for any layout, e.g. ``Q`` in Fortran order, whose rows are not contiguous) it asks for
    nothing."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(j, types.Integer)):
        raise TypeError(f"prefetch_row of a 2-D array by an integer row, not {arr}, {j}")

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        if aryty.layout != "C":  # a row is not contiguous: no hint
            return context.get_dummy_value()
        ary = context.make_array(aryty)(context, builder, args[0])
        row = context.cast(builder, args[1], sig.args[1], types.intp)
        p = cgutils.get_item_pointer(context, builder, aryty, ary, [row, context.get_constant(types.intp, 0)])
        byte = ir.IntType(8).as_pointer()
        base = builder.bitcast(p, byte)
        width = builder.mul(cgutils.unpack_tuple(builder, ary.shape, 2)[1],
                            context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(aryty.dtype))))
        i32 = ir.IntType(32)
        f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
                                           _PREFETCH)
        with cgutils.for_range_slice(builder, context.get_constant(types.intp, 0), width,
                                     context.get_constant(types.intp, 64)) as (off, _):
            builder.call(f, [builder.gep(base, [off]), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(arr, j), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    """``arr[*idx, 0:8] = v``."""
    _check_array(arr, idx)

    def codegen(context, builder, sig, args):
        builder.store(args[2], _lanes_pointer(context, builder, sig, args), align=8)
        return context.get_dummy_value()
    return types.void(arr, idx, f64x8), codegen


@intrinsic
def vsplat(typingctx, a):
    """Eight copies of the float64 ``a``."""

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float64)
        out = ir.Constant(_VT, ir.Undefined)
        for g in range(LANES):
            out = builder.insert_element(out, v, ir.Constant(ir.IntType(32), g))
        return out
    return f64x8(a), codegen


def _call(builder, name, args):
    f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VT, [_VT] * len(args)), name)
    return builder.call(f, args)


@intrinsic
def vfma(typingctx, a, b, c):
    """``a * b + c``, one rounding."""

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.v8f64", list(args))
    return f64x8(f64x8, f64x8, f64x8), codegen


@intrinsic
def vfma1(typingctx, a, b, c):
    """``a * b + c`` of three float64 scalars, one rounding (``llvm.fma.f64``, on every CPU)."""

    def codegen(context, builder, sig, args):
        d = ir.DoubleType()
        f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(d, [d] * 3), "llvm.fma.f64")
        return builder.call(f, [context.cast(builder, v, t, types.float64) for v, t in zip(args, sig.args)])
    return types.float64(a, b, c), codegen


@intrinsic
def vfnma(typingctx, a, b, c):
    """``c - a * b``, one rounding."""

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.v8f64", [builder.fneg(args[0]), args[1], args[2]])
    return f64x8(f64x8, f64x8, f64x8), codegen


def _binary(op, doc):
    @intrinsic
    def f(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return f64x8(f64x8, f64x8), codegen
    f.__doc__ = doc
    return f


vsub = _binary("fsub", "``a - b``.")
vmul = _binary("fmul", "``a * b``.")
vdiv = _binary("fdiv", "``a / b``.")


@intrinsic
def vpivot(typingctx, a):
    """``sqrt(a)`` where ``a > 0``, else ``1e-300`` (a Cholesky pivot, as :func:`streamdp.kernels.linalg.cholesky_lower`
    takes it)."""

    def codegen(context, builder, sig, args):
        root = _call(builder, "llvm.sqrt.v8f64", [args[0]])
        positive = builder.fcmp_ordered(">", args[0], ir.Constant(_VT, [0.0] * LANES))
        return builder.select(positive, root, ir.Constant(_VT, [1e-300] * LANES))
    return f64x8(f64x8), codegen
