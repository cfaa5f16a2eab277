// Tensor<T>: a cheap shared handle to shape, storage and autodiff data; Parameter<T>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/context.hpp"
#include "xgrad/core/device.hpp"
#include "xgrad/core/dtype.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/core/storage.hpp"

namespace xgrad {

struct TensorImpl;
namespace autograd {
struct Node;
}
namespace ir {
struct Value;
}

/// Autodiff state of one tensor. Kept apart from the storage so that a tape node can point
/// at its inputs' autodiff state without keeping their buffers alive.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;         // accumulated by backward() on leaves
  std::shared_ptr<autograd::Node> grad_fn;  // the op that made this tensor; null on leaves
  std::string name;                         // a Parameter's name
};

/// A tensor's tangent in one forward-mode pass (jvp): the pass's level, and the tangent.
struct Tangent {
  std::uint64_t level;
  std::shared_ptr<TensorImpl> value;
};

/// The untyped body behind every Tensor<T>. A concrete tensor has storage; a symbolic one,
/// made while jit traces a function, has none and stands for a value of the graph instead.
struct TensorImpl {
  Shape shape;
  DType dtype = DType::float32;
  std::shared_ptr<Storage> storage;
  std::shared_ptr<AutogradMeta> autograd;  // null while nothing asked for gradients
  std::shared_ptr<ir::Value> value;        // the graph value of a symbolic tensor
  // In-place updates while tracing: they rebind the tensor to a new graph value rather than
  // write its storage, so autodiff counts them here to catch stale saved tensors.
  std::uint64_t rebinds = 0;
  std::vector<Tangent> tangents;  // one per jvp level whose inputs this tensor depends on
  // Inside vmap, a batched tensor stands for one value of a batch: `physical` holds the batch
  // (on its axis 0) at vmap level `batch_level`, `shape` is one value's, and it has no storage.
  std::shared_ptr<TensorImpl> physical;
  std::uint64_t batch_level = 0;

  TensorImpl(Shape s, DType d, std::shared_ptr<Storage> st) : shape(s), dtype(d), storage(std::move(st)) {}
  TensorImpl(Shape s, DType d, std::shared_ptr<ir::Value> v) : shape(s), dtype(d), value(std::move(v)) {}

  /// A fresh contiguous buffer for `shape` elements of `dtype`; an AllocationError when the
  /// shape is not one a tensor can have or its bytes cannot be had.
  XGRAD_API static std::shared_ptr<TensorImpl> allocate(const Shape& shape, DType dtype, Device device = Device::cpu);
  bool requires_grad() const { return autograd && autograd->requires_grad; }
};

/// A tensor of any dtype: what the tape and gradient rules pass around.
class TensorBase {
 public:
  TensorBase() = default;
  explicit TensorBase(std::shared_ptr<TensorImpl> impl) : m_impl(std::move(impl)) {}

  /// False for a default-constructed handle, or the grad() of a tensor that has none yet.
  bool defined() const { return static_cast<bool>(m_impl); }
  const Shape& shape() const { return checked().shape; }
  int ndim() const { return checked().shape.ndim(); }
  std::int64_t numel() const { return checked().shape.numel(); }
  DType dtype() const { return checked().dtype; }
  Device device() const {
    auto& impl = checked();
    if (impl.physical) return TensorBase(impl.physical).device();
    return impl.storage ? impl.storage->device() : Device::cpu;
  }
  /// True for a tensor that stands for a value of a graph being traced (it has no data).
  bool is_symbolic() const { return !checked().storage; }
  bool requires_grad() const { return checked().requires_grad(); }
  /// True for tensors made by the user rather than by an op that autodiff recorded.
  bool is_leaf() const;
  /// How often the storage was written in place; autodiff compares it at backward().
  std::uint64_t version() const {
    auto& impl = checked();
    return impl.storage ? impl.storage->version() : 0;
  }

  const std::shared_ptr<TensorImpl>& impl() const { return m_impl; }

 protected:
  TensorImpl& checked() const {
    if (!m_impl)
      throw AutogradError("Tensor: use of an undefined tensor (an empty handle, or grad() before any backward)");
    return *m_impl;
  }
  /// The storage of a concrete tensor; reading a symbolic tensor's data is a user error.
  Storage& storage() const {
    auto& impl = checked();
    if (impl.physical) [[unlikely]]
      throw ValueError(detail::concat("Tensor: inside vmap this tensor (", dtype_name(impl.dtype), impl.shape,
                                      ") stands for each value of a batch, so its elements are not known one by one; "
                                      "return it from the function vmap maps and read the batched result"));
    if (!impl.storage) [[unlikely]]
      throw ValueError(
          is_tracing()
              ? detail::concat("Tensor: the value of a traced tensor (", dtype_name(impl.dtype), impl.shape,
                               ") is not known while jit traces the function; use xg::print to see it when the graph "
                               "runs, and xg::cond / xg::while_loop for control flow that depends on it")
              : detail::concat("Tensor: this tensor (", dtype_name(impl.dtype), impl.shape,
                               ") was made inside a jit trace and kept after the trace ended (in a global, a member or "
                               "a captured variable), so it has no data. Return it from the jitted function and use "
                               "the returned tensor instead"));
    return *impl.storage;
  }
  std::shared_ptr<TensorImpl> m_impl;
};

template <Element T> class Tensor : public TensorBase {
 public:
  using value_type = T;

  Tensor() = default;
  /// Wraps an untyped body; throws if its dtype is not T.
  explicit Tensor(std::shared_ptr<TensorImpl> impl, SourceLoc loc = SourceLoc::current())
      : TensorBase(std::move(impl)) {
    if (m_impl && m_impl->dtype != dtype_of<T>()) [[unlikely]]
      throw ShapeError(detail::op_message("Tensor", loc, "cannot view a ", dtype_name(m_impl->dtype), m_impl->shape,
                                          " tensor as Tensor<", dtype_name(dtype_of<T>()),
                                          ">; convert it with xg::cast"));
  }
  explicit Tensor(const TensorBase& base, SourceLoc loc = SourceLoc::current()) : Tensor(base.impl(), loc) {}

  /// An uninitialised tensor of the given shape (kernels write every element).
  static Tensor empty(const Shape& shape, Device device = Device::cpu) {
    return Tensor(TensorImpl::allocate(shape, dtype_of<T>(), device));
  }

  /// The elements in memory: a host pointer on Device::cpu, a device pointer on Device::thrust
  /// (under CUDA not readable by host code: use to_vector(), item() or to(Device::cpu)).
  T* data() { return static_cast<T*>(storage().data()); }
  const T* data() const { return static_cast<const T*>(storage().data()); }

  /// The elements, row-major, on the host whatever the device.
  std::vector<T> to_vector() const {
    if (device() == Device::cpu) return std::vector<T>(data(), data() + numel());
    auto host = std::make_unique<T[]>(static_cast<std::size_t>(numel()));
    detail::copy_bytes(host.get(), Device::cpu, data(), device(), static_cast<std::size_t>(numel()) * sizeof(T));
    return std::vector<T>(host.get(), host.get() + numel());
  }

  /// The value of a one-element tensor, on the host.
  T item(SourceLoc loc = SourceLoc::current()) const {
    if (numel() != 1)
      throw ShapeError(detail::op_message("item", loc, "expected a tensor with one element, got shape ", shape()));
    if (device() == Device::cpu) return data()[0];
    T value;
    detail::copy_bytes(&value, Device::cpu, data(), device(), sizeof(T));
    return value;
  }

  /// This tensor on `device`: itself when it is there already, else a copy there (gradients
  /// flow back to this one). Not inside jit: move a compiled function's inputs before calling.
  Tensor to(Device device, SourceLoc loc = SourceLoc::current()) const { return to_device(*this, device, loc); }

  /// Turns gradient tracking on or off for this (leaf) tensor.
  Tensor& set_requires_grad(bool on) requires FloatingPoint<T> {
    auto& impl = checked();
    if (!impl.autograd) impl.autograd = std::make_shared<AutogradMeta>();
    impl.autograd->requires_grad = on;
    return *this;
  }

  /// The gradient accumulated by backward(); undefined (defined() == false) before any.
  Tensor grad() const {
    auto& impl = checked();
    return impl.autograd && impl.autograd->grad ? Tensor(impl.autograd->grad) : Tensor();
  }
  /// Forgets the accumulated gradient.
  void zero_grad() {
    if (auto& meta = checked().autograd) meta->grad.reset();
  }

  /// Backpropagates from this tensor with a sensitivity of ones, accumulating into the
  /// grad() of every leaf that requires grad (defined in autograd/engine.hpp).
  void backward(SourceLoc loc = SourceLoc::current()) const;

  /// A copy as an xtensor array, xt::xarray<U> (defined in core/xtensor_interop.hpp, which
  /// xgrad/xgrad.hpp includes).
  // Its return type is deduced so that this header names nothing of xtensor's: its headers
  // are large, and only code that converts needs them.
  template <class U = T> auto to_xarray() const;

  /// The same storage, cut off from autodiff: no gradient flows through it, and it carries no
  /// tangent in forward mode (jvp).
  Tensor detach() const {
    auto& impl = checked();
    auto out = std::make_shared<TensorImpl>(impl.shape, impl.dtype, impl.storage);
    out->value = impl.value;
    out->physical = impl.physical;
    out->batch_level = impl.batch_level;
    return Tensor(std::move(out));
  }

  /// The Parameter name, or "" for an unnamed tensor.
  std::string name() const {
    auto& impl = checked();
    return impl.autograd ? impl.autograd->name : std::string();
  }

  // In-place updates (defined in ops/inplace-inl.hpp). They bump the version counter, so a
  // tensor saved for backward and then changed makes backward() throw.
  Tensor& assign(const Tensor& src, SourceLoc loc = SourceLoc::current());
  Tensor& operator+=(Located<Tensor> rhs);
  Tensor& operator-=(Located<Tensor> rhs);
  Tensor& operator*=(Located<Tensor> rhs);
  Tensor& operator/=(Located<Tensor> rhs);
  Tensor& operator+=(Located<T> rhs);
  Tensor& operator-=(Located<T> rhs);
  Tensor& operator*=(Located<T> rhs);
  Tensor& operator/=(Located<T> rhs);

  // Operators take the left operand as Located so the user's line reaches error messages.
  // They are hidden friends: found through the Tensor argument, converting it implicitly.
  friend Tensor operator+(Located<Tensor> a, const Tensor& b) requires Numeric<T> { return add(a.value, b, a.loc); }
  friend Tensor operator-(Located<Tensor> a, const Tensor& b) requires Numeric<T> { return sub(a.value, b, a.loc); }
  friend Tensor operator*(Located<Tensor> a, const Tensor& b) requires Numeric<T> { return mul(a.value, b, a.loc); }
  friend Tensor operator/(Located<Tensor> a, const Tensor& b) requires Numeric<T> { return div(a.value, b, a.loc); }
  friend Tensor operator+(Located<Tensor> a, T b) requires Numeric<T> {
    return add(a.value, scalar_like(a.value, b), a.loc);
  }
  friend Tensor operator-(Located<Tensor> a, T b) requires Numeric<T> {
    return sub(a.value, scalar_like(a.value, b), a.loc);
  }
  friend Tensor operator*(Located<Tensor> a, T b) requires Numeric<T> {
    return mul(a.value, scalar_like(a.value, b), a.loc);
  }
  friend Tensor operator/(Located<Tensor> a, T b) requires Numeric<T> {
    return div(a.value, scalar_like(a.value, b), a.loc);
  }
  friend Tensor operator+(Located<T> a, const Tensor& b) requires Numeric<T> {
    return add(scalar_like(b, a.value), b, a.loc);
  }
  friend Tensor operator-(Located<T> a, const Tensor& b) requires Numeric<T> {
    return sub(scalar_like(b, a.value), b, a.loc);
  }
  friend Tensor operator*(Located<T> a, const Tensor& b) requires Numeric<T> {
    return mul(scalar_like(b, a.value), b, a.loc);
  }
  friend Tensor operator/(Located<T> a, const Tensor& b) requires Numeric<T> {
    return div(scalar_like(b, a.value), b, a.loc);
  }
  friend Tensor operator-(Located<Tensor> a) requires Numeric<T> { return neg(a.value, a.loc); }
  // Comparisons give Tensor<bool>, as in NumPy.
  friend Tensor<bool> operator<(Located<Tensor> a, const Tensor& b) requires Numeric<T> {
    return less(a.value, b, a.loc);
  }
  friend Tensor<bool> operator>(Located<Tensor> a, const Tensor& b) requires Numeric<T> {
    return greater(a.value, b, a.loc);
  }
  friend Tensor<bool> operator<(Located<Tensor> a, T b) requires Numeric<T> {
    return less(a.value, scalar_like(a.value, b), a.loc);
  }
  friend Tensor<bool> operator>(Located<Tensor> a, T b) requires Numeric<T> {
    return greater(a.value, scalar_like(a.value, b), a.loc);
  }
};

namespace detail {

/// A copy of t's elements on `device`, with no autodiff history.
XGRAD_API TensorBase copy_to(const TensorBase& t, Device device);
template <Element T> Tensor<T> copy_to(const Tensor<T>& t, Device device) {
  return Tensor<T>(copy_to(static_cast<const TensorBase&>(t), device));
}

}  // namespace detail

/// A rank-0 tensor holding `value` (for tensor-scalar operators). It stays on the cpu: a
/// one-element cpu tensor may meet tensors of any device, whose kernels read it as a value.
template <Element T> Tensor<T> scalar_like(const Tensor<T>&, T value) {
  auto out = Tensor<T>::empty(Shape{});
  out.data()[0] = value;
  return out;
}

inline bool TensorBase::is_leaf() const {
  auto& impl = checked();
  return !impl.autograd || !impl.autograd->grad_fn;
}

/// A named tensor that requires grad and keeps its identity: optimizers update it in place,
/// and a jitted function reads its current value on every call.
template <FloatingPoint T> class Parameter : public Tensor<T> {
 public:
  Parameter() = default;
  Parameter(const Tensor<T>& init, std::string name) : Tensor<T>(init.detach()) {
    this->set_requires_grad(true);
    this->m_impl->autograd->name = std::move(name);
  }
  /// Another handle to the Parameter behind `t` (no copy, same identity).
  static Parameter shared(const Tensor<T>& t) {
    Parameter p;
    static_cast<Tensor<T>&>(p) = t;
    return p;
  }
};

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/core/tensor-inl.hpp"
#endif
