// Implementation of the cuDNN backend-API builder (see cudnn_graph.h). Written against the backend
// descriptor documentation of cuDNN 9; the node-by-node attribute sets mirror what cuDNN's public
// frontend sets for the same node kinds.
#if defined(WAN_HAVE_CUDNN)
#include "kernels/cudnn_graph.h"

#include "core/error.h"

namespace wan::cuda::cudnn_graph {

void check(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  throw Error(cat("cuDNN ", what, ": ", cudnnGetErrorString(s), " (", static_cast<int>(s), ")",
                  last[0] ? cat(": ", last) : std::string()),
              ErrorKind::Internal);
}

Desc::Desc(cudnnBackendDescriptorType_t type, const char* what) {
  check(cudnnBackendCreateDescriptor(type, &d_), what);
}

Desc::~Desc() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

Desc& Desc::operator=(Desc&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

Desc& Desc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n, const void* v,
                const char* what) {
  check(cudnnBackendSetAttribute(d_, name, type, n, v), what);
  return *this;
}

Desc& Desc::set_desc(cudnnBackendAttributeName_t name, const Desc& other, const char* what) {
  cudnnBackendDescriptor_t o = other.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o, what);
}

void Desc::finalize(const char* what) { check(cudnnBackendFinalize(d_), what); }

Desc& Arena::tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides, bool is_virtual, bool by_value) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "create tensor");
  const int64_t align = 16;
  const bool virt = is_virtual;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type")
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims")
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides")
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid")
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment")
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor is_virtual");
  if (by_value) {
    const bool bv = true;
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor is_by_value");
  }
  t.finalize(cat("finalize tensor uid ", uid).c_str());
  return add(std::move(t));
}

Desc& Arena::pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, const Desc& x, const Desc* b, const Desc* t,
                       const Desc& y, int64_t axis) {
  Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "create pointwise");
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode")
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, "pointwise precision");
  if (mode == CUDNN_POINTWISE_GEN_INDEX)
    pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  pw.finalize(cat("finalize pointwise mode ", static_cast<int>(mode)).c_str());
  const Desc& pwr = add(std::move(pw));

  Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "create pointwise op");
  const float one = 1.0f;
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pwr, "pointwise op descriptor")
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise op x")
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise op y");
  if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b, "pointwise op b");
  if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t, "pointwise op t");
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1")
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
  op.finalize(cat("finalize pointwise op mode ", static_cast<int>(mode)).c_str());
  return add(std::move(op));
}

Desc& Arena::reduction(cudnnReduceTensorOp_t rop, const Desc& x, const Desc& y) {
  Desc rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "create reduction");
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rop, "reduction operator")
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction compute type");
  rd.finalize("finalize reduction");
  const Desc& rdr = add(std::move(rd));

  Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "create reduction op");
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction op x")
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction op y")
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rdr, "reduction op descriptor");
  op.finalize("finalize reduction op");
  return add(std::move(op));
}

Desc& Arena::matmul(const Desc& a, const Desc& b, const Desc& c, const Desc* m_override, const Desc* n_override,
                    const Desc* k_override, bool set_padding, double padding) {
  Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "create matmul");
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul compute type");
  if (set_padding) mm.set(CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding, "matmul padding");
  mm.finalize("finalize matmul");
  const Desc& mmr = add(std::move(mm));

  Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "create matmul op");
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul op a")
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul op b")
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul op c")
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mmr, "matmul op descriptor");
  if (m_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, *m_override, "matmul M override");
  if (n_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, *n_override, "matmul N override");
  if (k_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, *k_override, "matmul K override");
  op.finalize("finalize matmul op");
  return add(std::move(op));
}

Desc operation_graph(cudnnHandle_t handle, const std::vector<const Desc*>& ops) {
  std::vector<cudnnBackendDescriptor_t> raw;
  raw.reserve(ops.size());
  for (const Desc* o : ops) raw.push_back(o->get());
  Desc g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "create operation graph");
  g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(raw.size()), raw.data(),
        "operation graph ops")
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph handle");
  g.finalize("finalize operation graph");
  return g;
}

namespace {
int64_t engine_global_index(const Desc& cfg) {
  try {
    Desc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "create engine");
    cudnnBackendDescriptor_t e = eng.get();
    int64_t n = 0;
    check(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
          "engine config engine");
    int64_t idx = -1;
    check(cudnnBackendGetAttribute(eng.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &idx),
          "engine global index");
    return idx;
  } catch (const Error&) {
    return -1;  // only used for logs
  }
}
}  // namespace

Plan build_plan(cudnnHandle_t handle, const Desc& graph) {
  std::string reasons;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback list";
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "create heuristics");
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph")
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    try {
      heur.finalize("finalize heuristics");
    } catch (const Error& e) {
      reasons += cat("\n  ", mode_name, ": ", e.what());
      continue;
    }
    int64_t count = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                   nullptr),
          "heuristics result count");
    if (count <= 0) {
      reasons += cat("\n  ", mode_name, ": no engine configuration");
      continue;
    }
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "create engine config");
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &got, raw.data()),
          "heuristics results");
    for (int64_t i = 0; i < got && i < count; ++i) {
      try {
        Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "create plan");
        plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle")
            .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i], "plan engine config");
        plan.finalize("finalize execution plan");
        Plan p;
        int64_t n = 0;
        check(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                       &p.workspace),
              "plan workspace size");
        p.engine_index = engine_global_index(cfgs[i]);
        p.config = std::move(cfgs[i]);
        p.plan = std::move(plan);
        return p;
      } catch (const Error& e) {
        reasons += cat("\n  ", mode_name, " config ", i, " (engine ", engine_global_index(cfgs[i]), "): ", e.what());
      }
    }
  }
  throw Error(cat("cuDNN: no engine supports the attention graph:", reasons), ErrorKind::Internal);
}

void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
             void* workspace) {
  WAN_ASSERT(uids.size() == ptrs.size());
  Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "create variant pack");
  vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data(),
         "variant pack uids")
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data(),
           "variant pack pointers")
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "variant pack workspace");
  vp.finalize("finalize variant pack");
  check(cudnnBackendExecute(handle, plan.plan.get(), vp.get()), "execute");
}

}  // namespace wan::cuda::cudnn_graph
#endif  // WAN_HAVE_CUDNN
