#include "tiny_gpt.h"

#include "spill/checkpoint.h"

namespace spill::models {

GptBlockImpl::GptBlockImpl(const GptConfig& cfg)
    : heads_(cfg.heads), dropout_(cfg.dropout), attention_dropout_(cfg.attention_dropout) {
  TORCH_CHECK(cfg.hidden % cfg.heads == 0, "hidden (", cfg.hidden,
              ") must be a multiple of heads (", cfg.heads, ")");
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
  qkv_ = register_module("qkv", torch::nn::Linear(cfg.hidden, 3 * cfg.hidden));
  proj_ = register_module("proj", torch::nn::Linear(cfg.hidden, cfg.hidden));
  fc1_ = register_module("fc1", torch::nn::Linear(cfg.hidden, 4 * cfg.hidden));
  fc2_ = register_module("fc2", torch::nn::Linear(4 * cfg.hidden, cfg.hidden));
}

// Note [Attention without T x T]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// scaled_dot_product_attention runs a fused kernel (flash attention on CPU and CUDA) that never
// materialises the seq x seq score matrix, so a block's working set is a few layer inputs, as in
// real models. LibTorch's CPU kernel has no dropout: with attention_dropout > 0 it falls back to
// the math kernel, which builds the scores again. Hence dropout on attention weights is off by
// default (as in Llama and Mistral) and the residual branches carry the dropout.
torch::Tensor GptBlockImpl::attention(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads_;
  auto qkv = qkv_->forward(x).view({b, t, 3, heads_, d}).permute({2, 0, 3, 1, 4});
  const double p = is_training() ? attention_dropout_ : 0.0;
  auto out = torch::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], /*attn_mask=*/{}, p,
                                                 /*is_causal=*/true);
  out = out.transpose(1, 2).reshape({b, t, c});
  return torch::dropout(proj_->forward(out), dropout_, is_training());
}

torch::Tensor GptBlockImpl::forward(torch::Tensor x) {
  x = x + attention(ln1_->forward(x));
  auto mlp = fc2_->forward(torch::gelu(fc1_->forward(ln2_->forward(x))));
  return x + torch::dropout(mlp, dropout_, is_training());
}

TinyGptImpl::TinyGptImpl(const GptConfig& cfg) : cfg_(cfg) {
  tok_ = register_module("tok", torch::nn::Embedding(cfg.vocab, cfg.hidden));
  pos_ = register_module("pos", torch::nn::Embedding(cfg.max_seq, cfg.hidden));
  blocks_ = register_module("blocks", torch::nn::Sequential());
  for (int64_t i = 0; i < cfg.layers; ++i) blocks_->push_back(GptBlock(cfg));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
  head_ = register_module("head", torch::nn::Linear(cfg.hidden, cfg.vocab));
}

torch::Tensor TinyGptImpl::forward(const torch::Tensor& tokens,
                                   const std::shared_ptr<TensorStash>& stash) {
  const int64_t t = tokens.size(1);
  auto positions =
      torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  auto h =
      torch::dropout(tok_->forward(tokens) + pos_->forward(positions), cfg_.dropout, is_training());
  h = run_blocks(blocks_, stash, h);
  return head_->forward(ln_f_->forward(h));
}

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

torch::Tensor run_blocks(torch::nn::Sequential& blocks, const std::shared_ptr<TensorStash>& stash,
                         torch::Tensor x) {
  for (std::size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks->ptr<GptBlockImpl>(i);
    if (!stash) {
      x = block->forward(x);
    } else {
      x = checkpoint(*stash, [block](const torch::Tensor& in) { return block->forward(in); }, x);
    }
  }
  return x;
}

}  // namespace spill::models
