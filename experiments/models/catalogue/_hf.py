"""Hugging Face ``transformers`` 4.x Flax architectures with a trainable head, enumerated from
``transformers`` itself (:data:`HEADS`: its Flax auto mappings for causal LM, seq2seq,
masked LM and image classification), one entry per head class: random weights, no
download, no dim named, dropout off (``train=False``; ``train=True`` only where the model has
batch statistics, ResNet and RegNet, whose updates are the step's state).

Each architecture has a tiny config (2 layers of width 64, 16 tokens, 8 sequences; 32x32
images) and the config of one published checkpoint (:data:`ARCHS`, named there) with a
pretraining-sized step. Llama, Mistral, BERT and T5 are the wrappers of
``experiments/models/libraries/`` (their sizes ``llama2-7b``, ``mistral-7b``,
``bert-large``, ``t5-3b``).
"""

from __future__ import annotations

from typing import Any

import jax
import transformers
from _steps import (
    LIBRARIES,
    cast,
    config,
    image_workload,
    masked_lm_loss,
    seq2seq_loss,
    text_workload,
    token_workload,
)
from transformers.models.auto import configuration_auto, modeling_flax_auto

import autolayout as al

# the families, in the order a class listed under two is given to the first: BART's
# conditional generation is in the masked-LM mapping too
HEADS = {
    "seq2seq": "FLAX_MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "causal-lm": "FLAX_MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "FLAX_MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "image-classification": "FLAX_MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
SUFFIX = {"seq2seq": "s2s", "causal-lm": "clm", "masked-lm": "mlm", "image-classification": "img"}
# the head classes listed under another model type too: the same code, one entry
ALIASES = {"gpt-sw3": "gpt2 (hf_gpt2_clm): the same class, FlaxGPT2LMHeadModel, and config"}
BATCH_STATS = ("resnet", "regnet")  # the classifiers with BatchNorm: train=True, its state
# the library wrappers that already are an entry's model (experiments/models/libraries/)
WRAPPED = {"hf_llama_clm": ("hf_llama.py", "llama2-7b"), "hf_mistral_clm": ("hf_mistral.py", "mistral-7b"),
           "hf_bert_mlm": ("hf_bert.py", "bert-large"), "hf_t5_s2s": ("hf_t5.py", "t5-3b")}  # fmt: skip


def heads() -> dict[str, tuple[str, str]]:
    """Every Flax head class of the four families: class name -> (family, model type); a
    class listed under an alias (:data:`ALIASES`) too is named by its own model type."""
    out: dict[str, tuple[str, str]] = {}
    for family, mapping in HEADS.items():
        for model_type, cls in getattr(modeling_flax_auto, mapping).items():
            if model_type not in ALIASES:
                out.setdefault(cls, (family, model_type))
    return out


def aliases() -> dict[str, str]:
    """The head classes listed under an alias: "class (alias)" -> the entry that is it."""
    return {f"{cls} ({mt})": f"the entry of {ALIASES[mt]}"
            for mapping in HEADS.values()
            for mt, cls in getattr(modeling_flax_auto, mapping).items() if mt in ALIASES}  # fmt: skip


def _text(d, layers, heads, ff, vocab, pos, **kw) -> dict:  # BERT's names  # fmt: skip
    return dict(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=ff, vocab_size=vocab, max_position_embeddings=pos, **kw)  # fmt: skip


def _bart(d, enc, dec, heads, ff, vocab, pos, **kw) -> dict:  # BART's names  # fmt: skip
    return dict(d_model=d, encoder_layers=enc, decoder_layers=dec, encoder_attention_heads=heads,
                decoder_attention_heads=heads, encoder_ffn_dim=ff, decoder_ffn_dim=ff,
                vocab_size=vocab, max_position_embeddings=pos, **kw)  # fmt: skip


def _t5(d, layers, heads, d_kv, ff, vocab, **kw) -> dict:  # T5's names  # fmt: skip
    return dict(d_model=d, num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                d_kv=d_kv, d_ff=ff, vocab_size=vocab, feed_forward_proj="gated-gelu",
                tie_word_embeddings=False, **kw)  # fmt: skip


def _vision(d, layers, heads, ff, image, patch, labels, **kw) -> dict:  # ViT's names  # fmt: skip
    return dict(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=ff, image_size=image, patch_size=patch, num_labels=labels, **kw)  # fmt: skip


TEXT = dict(batch=8, seq=16)  # the tiny step
S2S = dict(batch=8, seq=16, target=8)
IMAGE = dict(batch=8, image=32, classes=10)
T_ROBERTA = _text(64, 2, 4, 128, 256, 66)  # RoBERTa's positions start after the padding id
P_ROBERTA = _text(1024, 24, 16, 4096, 50265, 514)
T_BART = _bart(64, 2, 2, 4, 128, 256, 64)
T_T5 = _t5(64, 2, 4, 16, 128, 256)
T_GPT2 = dict(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=256, n_positions=64)
P_BART = (_bart(1024, 12, 12, 16, 4096, 50265, 1024), dict(batch=128, seq=1024, target=1024))

# model type -> (tiny config, tiny step), (checkpoint, its config, its step)
# fmt: off
ARCHS: dict[str, tuple[tuple[dict, dict], tuple[str, dict, dict]]] = {
    # decoder-only LMs
    "gpt2": ((T_GPT2, TEXT), ("gpt2-xl", dict(n_embd=1600, n_layer=48, n_head=25,
             vocab_size=50257, n_positions=1024), dict(batch=512, seq=1024))),
    "gpt_neo": ((dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                      vocab_size=256, max_position_embeddings=64,
                      attention_types=[[["global", "local"], 1]], window_size=8), TEXT),
                ("gpt-neo-2.7B", dict(hidden_size=2560, num_layers=32, num_heads=20,
                 vocab_size=50257, max_position_embeddings=2048, window_size=256,
                 attention_types=[[["global", "local"], 16]]), dict(batch=256, seq=2048))),
    "gptj": ((dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=128, vocab_size=256,
                   n_positions=64), TEXT),
             ("gpt-j-6b", dict(n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, vocab_size=50400,
              n_positions=2048), dict(batch=256, seq=2048))),
    "gemma": ((dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=256,
                    hidden_activation="gelu_pytorch_tanh",
                    max_position_embeddings=64), TEXT),
              ("gemma-7b", dict(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
               num_attention_heads=16, num_key_value_heads=16, head_dim=256, vocab_size=256000,
               hidden_activation="gelu_pytorch_tanh",
               max_position_embeddings=8192), dict(batch=128, seq=4096))),
    "bloom": ((dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=256), TEXT),
              ("bloom-7b1", dict(hidden_size=4096, n_layer=30, n_head=32, vocab_size=250880),
               dict(batch=256, seq=2048))),
    "opt": ((dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                  vocab_size=256, max_position_embeddings=64, word_embed_proj_dim=64), TEXT),
            ("opt-6.7b", dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
             ffn_dim=16384, vocab_size=50272, max_position_embeddings=2048,
             word_embed_proj_dim=4096), dict(batch=256, seq=2048))),
    "xglm": ((dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=128, vocab_size=256,
                   max_position_embeddings=64), TEXT),
             ("xglm-7.5B", dict(d_model=4096, num_layers=32, attention_heads=32, ffn_dim=16384,
              vocab_size=256008, max_position_embeddings=2048), dict(batch=256, seq=2048))),
    # encoders (a masked-LM head; the causal-LM head where transformers has one)
    "bert": ((_text(64, 2, 4, 128, 256, 64), TEXT),  # its causal-LM head (hf_bert.py: MLM)
             ("bert-large", _text(1024, 24, 16, 4096, 30522, 512), dict(batch=256, seq=512))),
    "roberta": ((T_ROBERTA, TEXT), ("roberta-large", P_ROBERTA, dict(batch=256, seq=512))),
    "xlm-roberta": ((T_ROBERTA, TEXT), ("xlm-roberta-large", {**P_ROBERTA, "vocab_size": 250002},
                    dict(batch=256, seq=512))),
    "roberta-prelayernorm": ((T_ROBERTA, TEXT), ("efficient_mlm_m0.40", P_ROBERTA,
                             dict(batch=256, seq=512))),
    "electra": ((_text(64, 2, 4, 128, 256, 64, embedding_size=32), TEXT),
                ("electra-large-generator", _text(256, 24, 4, 1024, 30522, 512,
                 embedding_size=1024), dict(batch=256, seq=512))),
    "albert": ((_text(64, 2, 4, 128, 256, 64, embedding_size=32), TEXT),
               ("albert-xxlarge-v2", _text(4096, 12, 64, 16384, 30000, 512, embedding_size=128),
                dict(batch=256, seq=512))),
    "distilbert": ((dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=256,
                         max_position_embeddings=64), TEXT),
                   ("distilbert-base-uncased", dict(dim=768, n_layers=6, n_heads=12,
                    hidden_dim=3072, vocab_size=30522, max_position_embeddings=512),
                    dict(batch=256, seq=512))),
    # block-sparse attention: the tiny sequence is long enough for its blocks (> 7 blocks)
    "big_bird": ((_text(64, 2, 4, 128, 256, 64, block_size=4, num_random_blocks=1),
                  dict(batch=8, seq=32)),
                 ("bigbird-roberta-large", _text(1024, 24, 16, 4096, 50358, 4096, block_size=64,
                  num_random_blocks=3), dict(batch=128, seq=4096))),
    "roformer": ((_text(64, 2, 4, 128, 256, 64, embedding_size=64), TEXT),
                 ("roformer_chinese_base", _text(768, 12, 12, 3072, 50000, 1536,
                  embedding_size=768), dict(batch=256, seq=512))),
    # encoder-decoders
    "mt5": ((T_T5, S2S), ("mt5-xl", _t5(2048, 24, 32, 64, 5120, 250112),
             dict(batch=128, seq=512, target=128))),
    "longt5": ((_t5(64, 2, 4, 16, 128, 256, encoder_attention_type="transient-global",
                    local_radius=4, global_block_size=4), dict(batch=8, seq=32, target=8)),
               ("long-t5-tglobal-large", _t5(1024, 24, 16, 64, 2816, 32128,
                encoder_attention_type="transient-global", local_radius=127,
                global_block_size=16), dict(batch=128, seq=4096, target=512))),
    "bart": ((T_BART, S2S), ("bart-large", *P_BART)),
    "mbart": ((T_BART, S2S), ("mbart-large-cc25", {**P_BART[0], "vocab_size": 250027},
              P_BART[1])),
    "marian": (({**T_BART, "pad_token_id": 0, "decoder_start_token_id": 0}, S2S),
               ("opus-mt-en-de", _bart(512, 6, 6, 8, 2048, 58101, 512, pad_token_id=58100,
                decoder_start_token_id=58100), dict(batch=256, seq=512, target=512))),
    "pegasus": ((T_BART, S2S), ("pegasus-large", _bart(1024, 16, 16, 16, 4096, 96103, 1024),
                dict(batch=256, seq=1024, target=256))),
    "blenderbot": ((T_BART, S2S), ("blenderbot-3B", _bart(2560, 2, 24, 32, 10240, 8008, 128),
                   dict(batch=512, seq=128, target=128))),
    "blenderbot-small": ((T_BART, S2S), ("blenderbot_small-90M",
                         _bart(512, 8, 8, 16, 2048, 54944, 512),
                         dict(batch=256, seq=512, target=128))),
    # a BERT encoder and a GPT-2 decoder with cross-attention (EncoderDecoderConfig)
    "encoder-decoder": (((_text(64, 2, 4, 128, 256, 64), {**T_GPT2, "add_cross_attention": True}),
                         S2S),
                        ("bert2gpt2", (_text(768, 12, 12, 3072, 30522, 512),
                         dict(add_cross_attention=True, vocab_size=50257)),
                         dict(batch=256, seq=512, target=128))),
    # image classifiers (images [batch, 3, H, H], as their feature extractors give them)
    "vit": ((_vision(64, 2, 4, 128, 32, 8, 10), IMAGE),
            ("vit-base-patch16-224", _vision(768, 12, 12, 3072, 224, 16, 1000),
             dict(batch=1024, image=224, classes=1000))),
    "beit": ((_vision(64, 2, 4, 128, 32, 8, 10, use_relative_position_bias=True,
                      use_mean_pooling=True), IMAGE),
             ("beit-base-patch16-224", _vision(768, 12, 12, 3072, 224, 16, 1000,
              use_relative_position_bias=True, use_mean_pooling=True,
              layer_scale_init_value=0.1), dict(batch=1024, image=224, classes=1000))),
    "dinov2": ((dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
                     image_size=32, patch_size=8, num_labels=10), IMAGE),
               ("dinov2-base-imagenet1k-1-layer", dict(hidden_size=768, num_hidden_layers=12,
                num_attention_heads=12, image_size=224, patch_size=14, num_labels=1000),
                dict(batch=1024, image=224, classes=1000))),
    "resnet": ((dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                     num_labels=10), IMAGE),
               ("resnet-50", dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048],
                depths=[3, 4, 6, 3], layer_type="bottleneck", num_labels=1000),
                dict(batch=1024, image=224, classes=1000))),
    "regnet": ((dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8,
                     layer_type="y", num_labels=10), IMAGE),
               ("regnet-y-040", dict(embedding_size=32, hidden_sizes=[128, 192, 512, 1088],
                depths=[2, 6, 12, 2], groups_width=64, layer_type="y", num_labels=1000),
                dict(batch=1024, image=224, classes=1000))),
}
# fmt: on


def _t5_clip() -> None:
    """transformers 4.x's T5 family calls ``jnp.clip(x, a_max=...)``: the numpy the
    ``hf_t5`` wrapper gives Flax T5, given to LongT5 too (mT5 is T5's code)."""
    import hf_t5
    from transformers.models.longt5 import modeling_flax_longt5

    modeling_flax_longt5.jnp = hf_t5.modeling_flax_t5.jnp


def _config(model_type: str, kwargs: Any, causal: bool) -> Any:
    if model_type == "encoder-decoder":
        enc, dec = kwargs
        return transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
            transformers.BertConfig(**enc), transformers.GPT2Config(is_decoder=True, **dec)
        )
    cfg = configuration_auto.CONFIG_MAPPING[model_type](**kwargs)
    if causal and model_type != "bart":  # an encoder's causal-LM head: its causal mask
        cfg.is_decoder = True
    return cfg


def build(name: str, cls: str, family: str, model_type: str, size: str = "tiny",
          dtype: str = "") -> al.Workload:  # fmt: skip
    """The entry ``name``: ``transformers.<cls>`` at ``size`` ("tiny" or "published")."""
    if name in WRAPPED:
        file, published = WRAPPED[name]
        return al.load_workload(LIBRARIES / file, size="tiny" if size == "tiny" else published,
                                dtype=dtype)  # fmt: skip
    (tiny_cfg, tiny_step), (_, pub_cfg, pub_step) = ARCHS[model_type]
    c, dt = config({"tiny": tiny_step, "published": pub_step}, size, {}, dtype)
    cfg = _config(model_type, tiny_cfg if size == "tiny" else pub_cfg, family == "causal-lm")
    if model_type in ("longt5", "mt5"):
        _t5_clip()
    if model_type == "encoder-decoder":  # made only with its weights: made abstract
        made = {}
        jax.eval_shape(
            lambda: made.setdefault("m", getattr(transformers, cls)(cfg, dtype=dt)).params
        )
        model = made["m"]
    else:
        model = getattr(transformers, cls)(cfg, _do_init=False, dtype=dt)
    options, wl_name = dict(entry=name, size=size), f"{name}-{size}"
    B = c["batch"]

    def init(key):
        return cast(model.init_weights(key, model.input_shape), dt)

    if family == "image-classification":
        c = {**c, "channels": 3}
        if model_type not in BATCH_STATS:
            return image_workload(wl_name, lambda p, x: model(x, params=p).logits,
                                  init, c, options, channels_first=True)  # fmt: skip

        def apply(params, stats, images):  # batch statistics: the step's state
            out, new = model(images, params={**params, "batch_stats": stats}, train=True)
            return out.logits, new["batch_stats"]

        return image_workload(wl_name, apply, lambda k: _without(init(k), "batch_stats"), c,
                              options, channels_first=True,
                              state=lambda k: init(k)["batch_stats"])  # fmt: skip
    V = getattr(cfg, "vocab_size", None) or cfg.decoder.vocab_size
    if family == "causal-lm":
        return token_workload(wl_name, lambda p, t: model(t, params=p).logits, init,
                              {**c, "vocab": V}, options)  # fmt: skip
    if family == "masked-lm":

        def loss(params, batch):
            return masked_lm_loss(model(batch["tokens"], params=params).logits, batch["tokens"])

        return text_workload(wl_name, loss, init, {"tokens": (B, c["seq"])}, V, options)

    def loss(params, batch):  # seq2seq, teacher forcing
        out = model(batch["inputs"], decoder_input_ids=batch["targets"], params=params)
        return seq2seq_loss(out.logits, batch["targets"])

    V = min(V, getattr(getattr(cfg, "encoder", cfg), "vocab_size", V))  # ids both sides read
    return text_workload(wl_name, loss, init, {"inputs": (B, c["seq"]),
                         "targets": (B, c["target"])}, V, options)  # fmt: skip


def _without(tree: dict, key: str) -> dict:
    return {k: v for k, v in tree.items() if k != key}


def entries() -> tuple[dict[str, tuple[str, str, str, str]], dict[str, str]]:
    """name -> (family, model type, head class, published checkpoint) of every head class
    :func:`heads` lists, and the classes left out: class (model type) -> why."""
    out, left_out = {}, aliases()
    for cls, (family, model_type) in heads().items():
        name = f"hf_{model_type.replace('-', '_')}_{SUFFIX[family]}"
        if name in WRAPPED:
            out[name] = (family, model_type, cls, WRAPPED[name][1])
        elif model_type in ARCHS:
            out[name] = (family, model_type, cls, ARCHS[model_type][1][0])
        else:
            left_out[f"{cls} ({model_type})"] = "no config in the catalogue's ARCHS yet"
    return dict(sorted(out.items())), left_out
