"""Self-checks for the chapters' exercises: each says "correct" or what is still wrong.

A chapter calls ``selfattn.book.exercises.check_...(answer)``; the checker prints "✓ Correct: ..." or
"✗ Not yet: ..." and returns True or False. It never raises: a reader's half-written answer
(``None``, an exception inside their code) gets a short message, so a chapter always runs top to
bottom.

* :mod:`.scaffold`: the steps every checker is built from (call the reader's code, check the
  answer's type and shape, report);
* :mod:`.recall`: numbers, counts and short functions the library already computes;
* :mod:`.build`: build-it exercises, where the reader writes a real piece of attention (a layer,
  RoPE, splitting heads, a KV cache, an online softmax), run against the library.

``import selfattn`` does not import this package; ``selfattn.book.exercises`` loads it on first use.
"""

from .build import (
    check_attention_layer,
    check_kv_cache,
    check_multi_head_forward,
    check_online_softmax,
    check_rope,
    check_split_heads,
)
from .recall import (
    check_additive_bytes,
    check_additive_parameters,
    check_alibi_slopes,
    check_article_attention_shape,
    check_attention,
    check_attention_flops,
    check_bert_layer_parameters,
    check_cache_bytes,
    check_causal_mask,
    check_cnn_reach,
    check_dot_variance,
    check_merge_heads,
    check_mha_parameters,
    check_previous_share,
    check_repeat_kv,
    check_rope_turn,
    check_scores_bytes,
    check_sinusoidal,
    check_uniform_scale,
    check_unit_variance_scale,
    check_window_parameters,
)
from .scaffold import NotYet

__all__ = [
    "NotYet",
    "check_additive_bytes",
    "check_additive_parameters",
    "check_alibi_slopes",
    "check_article_attention_shape",
    "check_attention",
    "check_attention_flops",
    "check_attention_layer",
    "check_bert_layer_parameters",
    "check_cache_bytes",
    "check_causal_mask",
    "check_cnn_reach",
    "check_dot_variance",
    "check_kv_cache",
    "check_merge_heads",
    "check_mha_parameters",
    "check_multi_head_forward",
    "check_online_softmax",
    "check_previous_share",
    "check_repeat_kv",
    "check_rope",
    "check_rope_turn",
    "check_scores_bytes",
    "check_sinusoidal",
    "check_split_heads",
    "check_uniform_scale",
    "check_unit_variance_scale",
    "check_window_parameters",
]
from .build import check_masked_additive_attention  # noqa: I001
from .build import check_general_score

__all__ += ["check_general_score", "check_masked_additive_attention"]
from .recall import check_saturation_width  # noqa: E402, I001
from .recall import check_gradient_crossover  # noqa: E402

__all__ += ["check_gradient_crossover", "check_saturation_width"]
from .build import check_cache_bug, check_uptraining  # noqa: E402, I001
from .build import buggy_decode as buggy_decode  # noqa: E402  (shown by chapter 11; not a checker)
from .recall import check_model_cache_bytes  # noqa: E402

__all__ += ["check_cache_bug", "check_model_cache_bytes", "check_uptraining"]
