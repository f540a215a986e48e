// spill::checkpoint: bit-identical gradients (tests/reference_check.h says to what), every mode,
// dtypes, shapes, errors.
#include "spill/checkpoint.h"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include "core/stash/stash_fields.h"
#include "core/stash/stored_bytes.h"
#include "field_count.h"
#include "gpt_test_support.h"
#include "spill/spill.h"
#include "test_support.h"

using spill_test::check_with_references;
using spill_test::list_dir;
using spill_test::recompute_checkpoint;
using spill_test::RunResults;
using spill_test::ScratchDir;
using namespace spill_test::gpt;

namespace {

// A 1 MiB disk arena in a scratch directory, for the cases that need nothing more.
struct MiBArena {
  ScratchDir dir;
  spill::SpillArena arena = make_arena(dir.path(), spill::MiB);
};

// A random leaf tensor that requires grad.
torch::Tensor leaf(at::IntArrayRef shape) {
  return torch::randn(shape, torch::TensorOptions().requires_grad(true));
}

}  // namespace

TEST_CASE("checkpoint: GPT block gradients are bit-identical in every mode, with dropout") {
  ScratchDir dir;
  GptReference g(4, 99, {2, 32, 64});

  spill::SpillArena disk = make_arena(dir.path(), 16 * spill::MiB);
  spill::SpillArena ram = make_arena("", 16 * spill::MiB, spill::Backing::ram);
  for (auto stash : {spill::make_arena_stash(disk), spill::make_arena_stash(ram),
                     spill::make_in_memory_stash(), spill::make_per_file_stash(dir.path())}) {
    CAPTURE(stash->name());
    g.check(gpt_step(g.blocks, stash, g.x0));
  }
  CHECK(disk.stats().bytes_in_use == 0);
  CHECK(disk.stats().allocations == 4);
  CHECK(ram.stats().bytes_written == 4 * 2 * 32 * 64 * 4);
}

TEST_CASE("checkpoint: TransformerEncoderLayer gradients are bit-identical through the arena") {
  ScratchDir dir;
  torch::manual_seed(3);
  std::vector<torch::nn::TransformerEncoderLayer> layers;
  for (int i = 0; i < 3; ++i) {
    layers.emplace_back(
        torch::nn::TransformerEncoderLayerOptions(32, 4).dim_feedforward(64).dropout(0.1));
    layers.back()->train();
  }
  const torch::Tensor x0 = torch::randn({10, 3, 32});
  // `checkpointed(layer_forward, h)`: one layer's output, checkpointed or not.
  auto run = [&](auto checkpointed) {
    for (auto& l : layers) l->zero_grad();
    torch::manual_seed(5);
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor h = x;
    for (auto& layer : layers) {
      h = checkpointed([layer](const torch::Tensor& in) mutable { return layer->forward(in); }, h);
    }
    h.pow(2).sum().backward();
    Grads g{x.grad().clone(), {}, h.detach()};
    for (auto& l : layers)
      for (auto& p : l->parameters()) g.params.push_back(p.grad().clone());
    return g;
  };
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;
  const StepReferences references{
      run([](Forward f, const torch::Tensor& h) { return recompute_checkpoint(f, h); }),
      run([](Forward f, const torch::Tensor& h) { return f(h); })};
  spill::SpillArena arena = make_arena(dir.path(), 4 * spill::MiB);
  references.check(
      run([&](Forward f, const torch::Tensor& h) { return spill::checkpoint(arena, f, h); }));
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE("checkpoint: a second step reuses the same regions and peak stays put") {
  ScratchDir dir;
  auto blocks = gpt_blocks(3);
  spill::SpillArena arena = make_arena(dir.path(), 8 * spill::MiB);
  auto stash = spill::make_arena_stash(arena);
  const torch::Tensor x0 = torch::randn({1, 16, 64});
  gpt_step(blocks, stash, x0);
  const spill::ArenaStats first = arena.stats();
  gpt_step(blocks, stash, x0);
  const spill::ArenaStats second = arena.stats();
  CHECK(first.bytes_in_use == 0);
  CHECK(second.bytes_in_use == 0);
  CHECK(second.peak_bytes_in_use == first.peak_bytes_in_use);
  CHECK(second.high_water_bytes == first.high_water_bytes);
  CHECK(second.reuse_hits - first.reuse_hits == 3);
}

TEST_CASE("checkpoint: any dtype round-trips through every stash") {
  ScratchDir dir;
  spill::SpillArena arena = make_arena(dir.path(), 8 * spill::MiB);
  const std::vector<torch::Tensor> tensors = {torch::randn({3, 5}),
                                              torch::randn({4, 7}).to(torch::kBFloat16),
                                              torch::randn({9}).to(torch::kFloat16),
                                              torch::randint(-1000, 1000, {6, 2}, torch::kLong),
                                              torch::rand({17}) > 0.5,
                                              torch::randn({4, 6}).t(),
                                              torch::empty({0, 3})};
  for (auto stash : {spill::make_arena_stash(arena), spill::make_in_memory_stash(),
                     spill::make_per_file_stash(dir.path())}) {
    for (const auto& t : tensors) {
      CAPTURE(stash->name());
      CAPTURE(t.dtype());
      auto stored = stash->store(t);
      torch::Tensor back = stored->restore();
      CHECK(back.dtype() == t.dtype());
      CHECK(back.sizes() == t.sizes());
      CHECK(torch::equal(back, t));
    }
  }
  CHECK(arena.stats().bytes_in_use == 0);
}

// Note [One stash protocol, two front ends]: the layout a restore rebuilds is decided once, in
// the core, and agrees with LibTorch's own is_non_overlapping_and_dense / is_contiguous.
TEST_CASE("stash protocol: strides_to_keep keeps exactly the dense non-contiguous layouts") {
  const torch::Tensor base = torch::randn({2, 3, 4, 5});
  const std::vector<torch::Tensor> layouts = {base,
                                              base.permute({3, 1, 0, 2}),
                                              base.transpose(0, 1),
                                              base.select(1, 0),
                                              base.slice(3, 0, 5, 2),
                                              base.unsqueeze(2).permute({4, 2, 0, 1, 3}),
                                              torch::randn({4, 1}).t(),
                                              torch::randn({3}).expand({2, 3}),
                                              torch::empty({0, 3}).t(),
                                              torch::randn({6, 4}).t().slice(0, 1, 3)};
  for (const torch::Tensor& t : layouts) {
    CAPTURE(t.sizes());
    CAPTURE(t.strides());
    const bool kept_by_torch = !t.is_contiguous() && t.is_non_overlapping_and_dense();
    const std::vector<int64_t> kept =
        spill::detail::strides_to_keep(t.sizes().vec(), t.strides().vec());
    CHECK(kept.empty() == !kept_by_torch);
    if (!kept.empty()) CHECK(kept == t.strides().vec());
  }
}

TEST_CASE_FIXTURE(MiBArena, "stash protocol: a second restore is refused, not an empty tensor") {
  auto stash = spill::make_arena_stash(arena);
  const torch::Tensor x = torch::randn({4, 8}).t();
  auto stored = stash->store(x);
  const torch::Tensor back = stored->restore();
  CHECK(torch::equal(back, x));
  CHECK(back.strides() == x.strides());  // the transpose's layout, rebuilt
  CHECK_THROWS_WITH_AS(stored->restore(), doctest::Contains("already restored"),
                       spill::CheckpointError);
}

TEST_CASE_FIXTURE(MiBArena, "stash protocol: a refused restore is refused again the same way") {
  auto stash = spill::make_arena_stash(arena);
  torch::Tensor x = torch::randn({64});
  auto stored = stash->store(x);
  x.add_(1);                              // after store(): autograd's rule refuses it
  for (int call = 0; call < 2; ++call) {  // not "already restored" the second time
    CHECK_THROWS_WITH_AS(stored->restore(), doctest::Contains("modified by an inplace operation"),
                         spill::CheckpointError);
  }
}

TEST_CASE(
    "checkpoint: half-precision, non-contiguous and zero-element inputs get exact gradients") {
  ScratchDir dir;
  spill::SpillArena arena = make_arena(dir.path(), 4 * spill::MiB);
  torch::manual_seed(11);
  torch::Tensor w = leaf({8, 8});
  auto layer = [w](const torch::Tensor& in) { return torch::tanh(in.matmul(w.to(in.dtype()))); };
  for (const torch::Tensor& base :
       {torch::randn({8, 8}).t(), torch::randn({5, 8}).to(torch::kBFloat16),
        torch::randn({5, 8}).to(torch::kFloat16), torch::randn({0, 8})}) {
    CAPTURE(base.dtype());
    // `checkpointed(a)`: the layer's output, checkpointed or not.
    auto grads = [&](auto checkpointed) {
      torch::Tensor a = base.detach().clone().requires_grad_(true);
      if (base.stride(0) == 1 && base.size(0) > 1)
        a = base.detach().requires_grad_(true);  // keep it non-contiguous
      checkpointed(a).sum().backward();
      const RunResults r{{"input grad", a.grad().clone()}, {"weight grad", w.grad().clone()}};
      w.mutable_grad() = torch::Tensor();
      return r;
    };
    const RunResults plain = grads(layer);
    const RunResults recomputed =
        grads([&](const torch::Tensor& a) { return recompute_checkpoint(layer, a); });
    check_with_references(
        grads([&](const torch::Tensor& a) { return spill::checkpoint(arena, layer, a); }),
        recomputed, plain);
  }
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE_FIXTURE(
    MiBArena, "checkpoint: an input that does not require grad still gives parameter gradients") {
  torch::nn::Linear lin(4, 3);
  torch::Tensor x = torch::randn({2, 4});
  auto layer = [lin](const torch::Tensor& in) mutable { return lin(in); };
  // `checkpointed(x)`: the layer's output, checkpointed or not.
  auto grads = [&](auto checkpointed) {
    lin->zero_grad();
    checkpointed(x).sum().backward();
    return RunResults{{"weight grad", lin->weight.grad().clone()},
                      {"bias grad", lin->bias.grad().clone()}};
  };
  const RunResults plain = grads(layer);
  const RunResults recomputed =
      grads([&](const torch::Tensor& in) { return recompute_checkpoint(layer, in); });
  check_with_references(
      grads([&](const torch::Tensor& in) { return spill::checkpoint(arena, layer, in); }),
      recomputed, plain);
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE_FIXTURE(MiBArena, "checkpoint: extra tensors and several outputs get their gradients") {
  torch::manual_seed(2);
  const torch::Tensor x0 = torch::randn({3, 4}), p0 = torch::randn({3, 4});
  const torch::Tensor mask = torch::rand({3, 4}) > 0.3;
  auto layer = [](const torch::Tensor& h, const torch::Tensor& pos, const torch::Tensor& m) {
    auto y = (h + pos).masked_fill(m.logical_not(), 0.0);
    return std::vector<torch::Tensor>{y.sin(), (y * pos).sum(1)};
  };
  // `checkpointed(x, pos, mask)`: the layer's outputs, checkpointed or not.
  auto grads = [&](auto checkpointed) {
    torch::Tensor x = x0.clone().requires_grad_(true), pos = p0.clone().requires_grad_(true);
    const std::vector<torch::Tensor> outs = checkpointed(x, pos, mask);
    (outs[0].sum() + outs[1].pow(2).sum()).backward();
    return RunResults{{"input grad", x.grad()}, {"extra grad", pos.grad()}};
  };
  using T = const torch::Tensor&;
  const RunResults plain = grads(layer);
  const RunResults recomputed =
      grads([&](T x, T pos, T m) { return recompute_checkpoint(layer, x, pos, m); });
  check_with_references(
      grads([&](T x, T pos, T m) { return spill::checkpoint(arena, layer, x, pos, m); }),
      recomputed, plain);
  CHECK_FALSE(mask.requires_grad());
}

TEST_CASE_FIXTURE(
    MiBArena,
    "checkpoint: a layer that throws in forward releases its region and passes the error") {
  torch::Tensor x = leaf({64, 64});
  auto failing = [](const torch::Tensor&) -> torch::Tensor {
    throw std::domain_error("layer bug");
  };
  CHECK_THROWS_AS(spill::checkpoint(arena, failing, x), std::domain_error);
  CHECK(arena.stats().bytes_in_use == 0);
  CHECK(arena.stats().allocations == 1);
  CHECK(spill::checkpoint(arena, [](const torch::Tensor& in) { return in * 2; }, x).defined());
}

TEST_CASE_FIXTURE(
    MiBArena,
    "checkpoint: a layer that throws in recompute releases its region and passes the error") {
  torch::Tensor x = leaf({64, 64});
  int calls = 0;
  auto flaky = [&calls](const torch::Tensor& in) {
    if (++calls == 2) throw std::domain_error("recompute failed");
    return in.exp();
  };
  torch::Tensor y = spill::checkpoint(arena, flaky, x);
  CHECK(arena.stats().bytes_in_use > 0);
  CHECK_THROWS_WITH(y.sum().backward(), doctest::Contains("recompute failed"));
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE_FIXTURE(MiBArena, "checkpoint: backward twice through the same graph is a clear error") {
  torch::Tensor x = leaf({8, 8});
  torch::Tensor loss =
      spill::checkpoint(arena, [](const torch::Tensor& in) { return in.exp(); }, x).sum();
  loss.backward({}, /*retain_graph=*/true);
  const torch::Tensor first = x.grad().clone();
  CHECK_THROWS_WITH(loss.backward(), doctest::Contains("backward ran twice"));
  CHECK(torch::equal(x.grad(), first));
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE("checkpoint: when_full = error names the layer input and the arena stays usable") {
  ScratchDir dir;
  spill::ArenaOptions o = spill_test::options_in(dir.path(), 64 * 1024);
  o.when_full = spill::WhenFull::error;
  o.grow = false;
  spill::SpillArena arena(o);
  spill::StashOptions every_input;
  every_input.keep_last = 0;
  spill::set_stash_options(arena, every_input);
  torch::Tensor x = leaf({128, 256});  // 128 KiB
  try {
    spill::checkpoint(arena, [](const torch::Tensor& in) { return in * 3; }, x);
    FAIL("the checkpoint did not report the full arena");
  } catch (const spill::ArenaExhaustedError& e) {
    CHECK(e.requested_bytes() == 128 * 256 * 4);
    CHECK(e.free_bytes() == 64 * 1024);
    CHECK(std::string(e.what()).find("[128, 256]") != std::string::npos);
  }
  CHECK(arena.stats().bytes_in_use == 0);
  CHECK(arena.stats().live_regions == 0);
  CHECK(arena.stats().overflows == 1);
  torch::Tensor small = leaf({16, 16});
  spill::checkpoint(arena, [](const torch::Tensor& in) { return in * 3; }, small).sum().backward();
  CHECK(torch::equal(small.grad(), torch::full({16, 16}, 3.0)));
  CHECK(arena.stats().live_regions == 0);
  CHECK(arena.stats().capacity_bytes == 64 * 1024);
}

TEST_CASE_FIXTURE(MiBArena, "checkpoint: without grad mode nothing is stashed") {
  torch::NoGradGuard no_grad;
  torch::Tensor y =
      spill::checkpoint(arena, [](const torch::Tensor& in) { return in + 1; }, torch::zeros({4}));
  CHECK(torch::equal(y, torch::ones({4})));
  CHECK(arena.stats().allocations == 0);
}

TEST_CASE_FIXTURE(
    MiBArena, "checkpoint: a dropped graph frees its regions and per-file stashes leave no files") {
  auto per_file = spill::make_per_file_stash(dir.path());
  const auto before = list_dir(dir.path());
  {
    torch::Tensor x = leaf({32, 32});
    torch::Tensor y = spill::checkpoint(arena, [](const torch::Tensor& in) { return in * 2; }, x);
    torch::Tensor z =
        spill::checkpoint(*per_file, [](const torch::Tensor& in) { return in * 2; }, y);
    CHECK(arena.stats().bytes_in_use > 0);
    CHECK(list_dir(dir.path()).size() == before.size() + 1);
  }
  CHECK(arena.stats().bytes_in_use == 0);
  CHECK(list_dir(dir.path()) == before);
}

TEST_CASE("checkpoint: CheckpointedSequential matches the plain Sequential") {
  ScratchDir dir;
  spill::SpillArena arena = make_arena(dir.path(), 8 * spill::MiB);
  auto blocks = gpt_blocks(2);
  spill::CheckpointedSequential plain(blocks, nullptr);
  spill::CheckpointedSequential spilled(blocks, arena);
  CHECK(spilled->parameters().size() == blocks->parameters().size());
  const torch::Tensor x0 = torch::randn({2, 8, 64});
  // `forward(x)`: the blocks' output.
  auto run = [&](auto forward) {
    blocks->zero_grad();
    torch::manual_seed(8);
    torch::Tensor x = x0.clone().requires_grad_(true);
    forward(x).pow(2).sum().backward();
    return RunResults{{"input grad", x.grad()}};
  };
  check_with_references(run([&](const torch::Tensor& x) { return spilled->forward(x); }),
                        run(recomputed_blocks(blocks)),
                        run([&](const torch::Tensor& x) { return plain->forward(x); }));
  CHECK(arena.stats().allocations == 2);
}

TEST_CASE_FIXTURE(
    MiBArena, "checkpoint: sparse and meta tensors are refused by the spilling stashes, typed") {
  for (auto stash : {spill::make_arena_stash(arena), spill::make_per_file_stash(dir.path())}) {
    CAPTURE(stash->name());
    CHECK_THROWS_WITH_AS(stash->store(torch::eye(4).to_sparse()), doctest::Contains("dense"),
                         spill::InvalidArgumentError);
    CHECK_THROWS_WITH_AS(stash->store(torch::empty({4}, torch::Device(torch::kMeta))),
                         doctest::Contains("dense"), spill::InvalidArgumentError);
  }
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE_FIXTURE(MiBArena,
                  "checkpoint: a layer that returns its input unchanged still backpropagates") {
  torch::Tensor x = leaf({4, 4});
  torch::Tensor y = spill::checkpoint(arena, [](const torch::Tensor& in) { return in; }, x);
  (y * 3).sum().backward();
  CHECK(torch::equal(x.grad(), torch::full({4, 4}, 3.0)));
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE_FIXTURE(MiBArena,
                  "checkpoint: checkpoint_layers runs a list of layers like a plain loop") {
  torch::manual_seed(4);
  std::vector<torch::nn::Linear> linears = {torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)};
  std::vector<std::function<torch::Tensor(const torch::Tensor&)>> layers;
  for (auto& l : linears)
    layers.push_back([l](const torch::Tensor& in) mutable { return torch::relu(l(in)); });
  const torch::Tensor x0 = torch::randn({3, 8});
  // `forward(x)`: the layers' output.
  auto grad_of = [&](auto forward) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    forward(x).sum().backward();
    return RunResults{{"input grad", x.grad()}};
  };
  auto layers_through = [&](const std::shared_ptr<spill::TensorStash>& stash) {
    return [&layers, stash](const torch::Tensor& x) {
      return spill::checkpoint_layers(stash, layers, x);
    };
  };
  const RunResults plain = grad_of(layers_through(nullptr));
  const RunResults recomputed = grad_of([&](torch::Tensor x) {
    for (const auto& layer : layers) x = recompute_checkpoint(layer, x);
    return x;
  });
  check_with_references(grad_of(layers_through(spill::make_arena_stash(arena))), recomputed, plain);
  CHECK(arena.stats().allocations == 2);
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE("checkpoint: visit_fields names every field of StashOptions and StashStats, each once") {
  const auto visit_fields = [](const auto& s, auto&& visit) {
    spill::detail::visit_fields(s, visit);
  };
  spill_test::check_visits_every_field(spill::StashOptions{}, visit_fields);
  spill_test::check_visits_every_field(spill::StashStats{}, visit_fields);
}

// ---------------------------------------------------------------------------------------------
// The comparison rule itself (tests/reference_check.h)
// ---------------------------------------------------------------------------------------------

namespace {

// `t` with its first element one float step up: a last-bit difference.
torch::Tensor nudged(const torch::Tensor& t) {
  torch::Tensor n = t.clone();
  n.view(-1)[0] = torch::nextafter(t.view(-1)[0], t.view(-1)[0] + 1);
  return n;
}

}  // namespace

TEST_CASE(
    "reference check: a checkpointing reference that differs from no checkpointing fails "
    "nothing") {
  const torch::Tensor g = torch::randn({4, 4}), loss = torch::randn({});
  const RunResults ours{{"loss", loss}, {"input grad", g}};
  const RunResults recomputed{{"loss", loss.clone()}, {"input grad", g.clone()}};
  const RunResults plain{{"loss", loss.clone()}, {"input grad", nudged(g)}};
  const spill_test::ReferenceCheck r = spill_test::compare_with_references(ours, recomputed, plain);
  CHECK(r.passed());
  CHECK(r.ours_differ.empty());
  CHECK(r.reference_differs == std::vector<std::string>{"input grad"});
  CHECK(r.compared_with_plain == std::vector<std::string>{"loss"});
  CHECK(r.ours_differ_from_plain.empty());
}

TEST_CASE("reference check: a run that differs from the checkpointing reference fails") {
  const torch::Tensor g = torch::randn({4, 4});
  const RunResults ours{{"input grad", nudged(g)}};
  const RunResults reference{{"input grad", g}};
  SUBCASE("where the reference equals no checkpointing") {
    const spill_test::ReferenceCheck r =
        spill_test::compare_with_references(ours, reference, reference);
    CHECK_FALSE(r.passed());
    CHECK(r.ours_differ == std::vector<std::string>{"input grad"});
    CHECK(r.ours_differ_from_plain == std::vector<std::string>{"input grad"});
  }
  SUBCASE("even where ours equals no checkpointing") {
    const spill_test::ReferenceCheck r = spill_test::compare_with_references(ours, reference, ours);
    CHECK_FALSE(r.passed());
    CHECK(r.ours_differ == std::vector<std::string>{"input grad"});
    CHECK(r.reference_differs == std::vector<std::string>{"input grad"});
  }
  SUBCASE("in dtype alone") {
    const RunResults as_double{{"input grad", g.to(torch::kDouble)}};
    CHECK_FALSE(spill_test::compare_with_references(as_double, reference, reference).passed());
  }
  SUBCASE("or naming other results") {
    const RunResults renamed{{"weight grad", g}};
    const spill_test::ReferenceCheck r =
        spill_test::compare_with_references(renamed, reference, reference);
    CHECK_FALSE(r.passed());
    CHECK_FALSE(r.same_names);
  }
}

TEST_CASE("reference check: the recompute reference replays the forward's dropout masks") {
  torch::manual_seed(21);
  const torch::Tensor x0 = torch::randn({64, 64});
  auto layer = [](const torch::Tensor& in) { return torch::dropout(in, 0.5, true) * 3; };
  auto grads = [&](auto checkpointed) {
    torch::manual_seed(4);
    torch::Tensor x = x0.clone().requires_grad_(true);
    (checkpointed(x) * torch::rand({64, 64})).sum().backward();
    return x.grad();
  };
  // The gradient is the mask, scaled, times the later draw: exact, checkpointed or not; a
  // recomputation that drew a new mask would differ.
  CHECK(torch::equal(
      grads(layer), grads([&](const torch::Tensor& x) { return recompute_checkpoint(layer, x); })));
}
