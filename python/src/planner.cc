// kvtier.Planner and kvtier.fit_prefill (see planner.h and doc/python.md).
#include "planner.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "kvtier/planner.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier {
namespace {

// Planner::Choose or ChoosePrefix over the Python call's three arguments.
template <Plan (Planner::*kChoose)(const PlanRequest&) const>
Plan Call(const Planner& p, uint32_t prompt_tokens, uint32_t resident_blocks,
          std::vector<int> block_tier) {
  PlanRequest r;
  r.prompt_tokens = prompt_tokens;
  r.resident_blocks = resident_blocks;
  r.block_tier = std::move(block_tier);
  return (p.*kChoose)(r);
}

}  // namespace

void RegisterPlanner(nb::module_& m) {
  nb::class_<Plan>(m, "Plan", "One load-vs-recompute decision.")
      .def_prop_ro("choice", [](const Plan& p) { return std::string(PlanChoiceName(p.choice)); })
      .def_ro("load_blocks", &Plan::load_blocks)
      .def_ro("recompute_blocks", &Plan::recompute_blocks)
      .def_ro("predicted_s", &Plan::predicted_s)
      .def_ro("load_all_s", &Plan::load_all_s)
      .def_ro("recompute_all_s", &Plan::recompute_all_s)
      .def("__repr__", &Plan::ToString);

  nb::class_<Planner>(m, "Planner",
                      "The load-vs-recompute cost model over a cost profile (JSON, the format "
                      "of `kvtier calibrate`; doc/engine.md).")
      .def(
          "__init__",
          [](Planner* self, const std::string& profile_json, const std::string& source) {
            auto p = ParseCostProfile(profile_json, source);
            if (!p.ok()) RaiseStatus(p.status());
            new (self) Planner(std::move(p).value());
          },
          "profile_json"_a, "source"_a = "profile")
      .def_prop_ro("profile_json", [](const Planner& p) { return CostProfileToJson(p.profile()); })
      .def("tier_index",
           [](const Planner& p, const std::string& name) { return p.profile().FindTier(name); })
      .def("choose", &Call<&Planner::Choose>, "prompt_tokens"_a, "resident_blocks"_a,
           "block_tier"_a,
           "Recompute a head of the loadable run and load the rest (the reference engine).")
      .def("choose_prefix", &Call<&Planner::ChoosePrefix>, "prompt_tokens"_a, "resident_blocks"_a,
           "block_tier"_a,
           "Load a head of the loadable run and compute the rest (a paged engine: vLLM).")
      .def("load_seconds", &Planner::LoadSeconds, "tier"_a, "blocks"_a)
      .def("load_all_seconds", &Planner::LoadAllSeconds, "tier"_a, "tokens"_a)
      .def("recompute_all_seconds", &Planner::RecomputeAllSeconds, "tokens"_a)
      .def("crossover_tokens", &Planner::CrossoverTokens, "tier"_a,
           "max_tokens"_a = uint64_t{1} << 22);

  m.def(
      "fit_prefill",
      [](const std::vector<std::tuple<double, double, double>>& samples) {
        // (tokens, pairs, seconds): a step's tokens computed and key tokens attended.
        std::vector<PrefillSample> in;
        in.reserve(samples.size());
        for (const auto& [tokens, pairs, seconds] : samples) {
          PrefillSample s;
          s.tokens = tokens;
          s.pairs = pairs;
          s.seconds = seconds;
          in.push_back(s);
        }
        auto fit = FitPrefillCost(in);
        if (!fit.ok()) RaiseStatus(fit.status());
        nb::dict d;
        d["fixed_s"] = fit->fixed_s;
        d["per_token_s"] = fit->per_token_s;
        d["per_token_context_s"] = fit->per_token_context_s;
        return d;
      },
      "samples"_a,
      "Least-squares prefill cost from (tokens, pairs, seconds) samples, relative error.");
}

}  // namespace kvtier
