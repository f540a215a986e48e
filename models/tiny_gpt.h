// TinyGpt: a small GPT-style language model (token + position embeddings, pre-norm causal
// self-attention and MLP blocks, tied-free head) for tests, benchmarks and `spillarena train`.
// Not part of the installed library.
//
//   spill::models::GptConfig cfg;            // vocab 256 (bytes), hidden 128, 4 heads, 4 blocks
//   spill::models::TinyGpt gpt(cfg);
//   auto stash = spill::make_arena_stash(arena);
//   torch::Tensor logits = gpt->forward(tokens, stash);   // every block checkpointed
//   torch::Tensor loss = spill::models::next_token_loss(logits, targets);
#pragma once

#include <torch/torch.h>

#include <memory>

#include "spill/tensor_stash.h"

namespace spill::models {

struct GptConfig {
  int64_t vocab = 256;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t layers = 4;
  int64_t max_seq = 256;
  double dropout = 0.1;            // embeddings and residual branches
  double attention_dropout = 0.0;  // on attention weights; see Note [Attention without T x T]
};

class GptBlockImpl : public torch::nn::Module {
 public:
  explicit GptBlockImpl(const GptConfig& cfg);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::Tensor attention(const torch::Tensor& x);
  int64_t heads_;
  double dropout_;
  double attention_dropout_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(GptBlock);

class TinyGptImpl : public torch::nn::Module {
 public:
  explicit TinyGptImpl(const GptConfig& cfg);
  // tokens: int64 [batch, seq]. stash == nullptr runs the blocks without checkpointing.
  torch::Tensor forward(const torch::Tensor& tokens, const std::shared_ptr<TensorStash>& stash);
  torch::nn::Sequential& blocks() { return blocks_; }
  const GptConfig& config() const { return cfg_; }

 private:
  GptConfig cfg_;
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  torch::nn::Sequential blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(TinyGpt);

// Mean cross-entropy of logits [batch, seq, vocab] against targets [batch, seq].
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets);

// A stack of `layers` GPT blocks applied to x [batch, seq, hidden], each checkpointed into
// `stash` (nullptr: plain). For tests and benchmarks that need the block stack alone.
torch::Tensor run_blocks(torch::nn::Sequential& blocks, const std::shared_ptr<TensorStash>& stash,
                         torch::Tensor x);

}  // namespace spill::models
