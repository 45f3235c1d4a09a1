// tf_mpt's rewrite inside a TF1 Session's own graph optimisation.
//
// A Grappler custom optimizer named "TfMpt". A Session created under TF_MPT_ENABLE lists it in
// its ConfigProto (graph_options.rewrite_options.custom_optimizers); Grappler's meta-optimizer
// then hands it each graph the Session is about to run (one per set of feeds and fetches),
// after the built-in passes of the first iteration. Optimize() serialises the graph and the
// item's fetch, feed and keep lists and calls the rewriter that tf_mpt's Python side installed
// with tf_mpt_set_rewriter() (a ctypes callback, which takes the GIL: Session.run releases it
// while the runtime optimises). The callback either writes the rewritten GraphDef through the
// sink and returns 0, or returns non-zero: the graph is then left as it is (Aborted is
// Grappler's convention for "no change").
//
// Built by tf_mpt/automatic/native/library.py at first use against the installed TensorFlow's headers.

#include <atomic>
#include <string>

#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"

extern "C" {
typedef void (*TfMptSink)(void* context, const char* data, size_t size);
typedef int (*TfMptRewriter)(const char* graph, size_t graph_size, const char* request,
                             size_t request_size, TfMptSink sink, void* context);
}

namespace {

std::atomic<TfMptRewriter> installed_rewriter{nullptr};

void AppendToString(void* context, const char* data, size_t size) {
  static_cast<std::string*>(context)->append(data, size);
}

// Function bodies are rewritten by the Python side together with the graph that calls them
// (values stay half across call boundaries), so a library function handed over on its own
// is left alone, without entering Python.
bool IsLibraryFunction(const tensorflow::grappler::GrapplerItem& item) {
  for (const auto& function : item.graph.library().function()) {
    if (function.signature().name() == item.id) return true;
  }
  return false;
}

class TfMptOptimizer : public tensorflow::grappler::CustomGraphOptimizer {
 public:
  std::string name() const override { return "TfMpt"; }
  bool UsesFunctionLibrary() const override { return true; }

  absl::Status Init(const tensorflow::RewriterConfig_CustomGraphOptimizer* config) override {
    parameters_.clear();
    if (config != nullptr) {
      for (const auto& entry : config->parameter_map()) {
        parameters_ += "param\t" + entry.first + "\t" + entry.second.s() + "\n";
      }
    }
    return absl::OkStatus();
  }

  absl::Status Optimize(tensorflow::grappler::Cluster* cluster,
                        const tensorflow::grappler::GrapplerItem& item,
                        tensorflow::GraphDef* optimized_graph) override {
    // One instance serves one graph through all meta-optimizer iterations: rewrite in the
    // first, and let the second iteration's built-in passes clean up after the Casts.
    if (++calls_ > 1) return absl::AbortedError("tf_mpt rewrote this graph already");
    TfMptRewriter rewriter = installed_rewriter.load();
    if (rewriter == nullptr) return absl::AbortedError("tf_mpt's rewriter is not installed");
    if (IsLibraryFunction(item)) return absl::AbortedError("rewritten with its caller");
    std::string request = parameters_;
    request += "id\t" + item.id + "\n";
    for (const auto& fetch : item.fetch) request += "fetch\t" + fetch + "\n";
    for (const auto& feed : item.feed) request += "feed\t" + feed.first + "\n";
    for (const auto& keep : item.keep_ops) request += "keep\t" + keep + "\n";
    std::string graph;
    if (!item.graph.SerializeToString(&graph)) {
      return absl::AbortedError("tf_mpt could not serialise the graph");
    }
    std::string result;
    int status = rewriter(graph.data(), graph.size(), request.data(), request.size(),
                          &AppendToString, &result);
    if (status != 0) return absl::AbortedError("tf_mpt left the graph unchanged");
    if (!optimized_graph->ParseFromString(result)) {
      return absl::InternalError("tf_mpt returned a GraphDef that does not parse");
    }
    return absl::OkStatus();
  }

 private:
  std::string parameters_;
  int calls_ = 0;
};

}  // namespace

REGISTER_GRAPH_OPTIMIZER_AS(TfMptOptimizer, "TfMpt");

extern "C" {
// Installs (or, with nullptr, removes) the Python rewriter.
void tf_mpt_set_rewriter(TfMptRewriter rewriter) { installed_rewriter.store(rewriter); }
// Bumped when the request format or the callback's signature changes.
int tf_mpt_protocol_version() { return 1; }
}
