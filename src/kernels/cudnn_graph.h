// A compact builder over cuDNN's backend (graph) API: owning descriptor handles, one function per node
// kind the attention graph needs (tensor, pointwise, reduction, matmul), the operation graph, plan
// selection through the heuristics, and execution through a variant pack.
// Invariants: every failure throws wan::Error naming the step, with cuDNN's status and its last error
// text; descriptors are kept alive by their owner (Arena) until the plan that used them is destroyed,
// because cuDNN's documentation does not promise that finalized operations copy what they reference.
// Only compiled when cuDNN is present (WAN_HAVE_CUDNN).
#pragma once
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace wan::cuda::cudnn_graph {

// Throws wan::Error("cuDNN <what>: <status> (<last error text>)") unless s is success.
void check(cudnnStatus_t s, const char* what);

class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type, const char* what);
  ~Desc();
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  // Sets one attribute (n elements of `type` at `v`).
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n, const void* v,
            const char* what);
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other, const char* what);
  void finalize(const char* what);

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::array<int64_t, 4>;

// Owns the descriptors of one graph; hands out stable references.
class Arena {
 public:
  Desc& add(Desc d) { return descs_.emplace_back(std::move(d)); }
  // A 4-D tensor. by_value: a host scalar passed through the variant pack (dims all 1).
  Desc& tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides, bool is_virtual, bool by_value = false);
  // y = mode(x[, b][, t]); axis only for GEN_INDEX. compute: the math precision.
  Desc& pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, const Desc& x, const Desc* b, const Desc* t,
                  const Desc& y, int64_t axis = -1);
  Desc& reduction(cudnnReduceTensorOp_t op, const Desc& x, const Desc& y);
  // c = a·b (batched over the leading dims); optional runtime M/N/K overrides (int32 [B,1,1,1]
  // tensors) and a padding value for rows/columns beyond the override.
  Desc& matmul(const Desc& a, const Desc& b, const Desc& c, const Desc* m_override, const Desc* n_override,
               const Desc* k_override, bool set_padding, double padding);

 private:
  std::deque<Desc> descs_;
};

// Finalized operation graph over `ops` (in topological order).
Desc operation_graph(cudnnHandle_t handle, const std::vector<const Desc*>& ops);

struct Plan {
  Desc config;  // the engine configuration the plan was finalized from (kept alive with it)
  Desc plan;
  int64_t workspace = 0;
  int64_t engine_index = -1;  // cuDNN's global engine index (for logs)
};

// Asks the heuristics (mode A, then the fallback list) for engine configurations and returns the first
// that finalizes into an execution plan. Throws with every candidate's reason when none does.
Plan build_plan(cudnnHandle_t handle, const Desc& graph);

// Executes `plan` with the (uid, pointer) pairs; by-value tensors take a host pointer to the value.
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
             void* workspace);

}  // namespace wan::cuda::cudnn_graph
