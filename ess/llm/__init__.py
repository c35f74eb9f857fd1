"""A real pretrained language model run by ``ess``: SmolLM2-135M-Instruct from its GGUF file.

Modules, one concern each:

* :mod:`~ess.llm.gguf_file`: where the installed model file is; reading its metadata and dequantised tensors;
* :mod:`~ess.llm.weight_cache`: the decoded file cached between runs (atomic, checksummed);
* :mod:`~ess.llm.config`: :class:`LlamaConfig`, the architecture read from the metadata;
* :mod:`~ess.llm.weights`: :class:`LlamaWeights` in Hugging Face's layout (GGUF's Q/K row permutation undone);
* :mod:`~ess.llm.tokenizer`: byte-level BPE and chat template from the metadata;
* :mod:`~ess.llm.reference`: the forward pass in NumPy float64 (the oracle);
* :mod:`~ess.llm.llama`: :class:`LlamaModel`, the torch forward pass in pieces a decode engine drives layer by
  layer (:meth:`~LlamaModel.embed`, :meth:`~LlamaModel.attention_inputs`, :meth:`~LlamaModel.attention_output`,
  :meth:`~LlamaModel.logits`), with dense :meth:`~LlamaModel.prefill` / :meth:`~LlamaModel.decode`;
* :mod:`~ess.llm.attention`, :mod:`~ess.llm.kv_cache`: dense causal GQA attention and the dense K/V cache;
* :mod:`~ess.llm.generate`: greedy generation; :mod:`~ess.llm.loader`: :func:`load_model`;
* :mod:`~ess.llm.text`: real English text shipped with Python (long prompts, held-out text).

Heavy imports (``gguf``, ``tokenizers``, ``jinja2``) happen when a file is read or a tokenizer built.
"""
from .attention import dense_attention  # noqa: F401
from .config import LlamaConfig  # noqa: F401
from .generate import Generation, generate, prompt_ids  # noqa: F401
from .gguf_file import GGUFContents, ModelFileError, model_path, read_gguf, verify_installed  # noqa: F401
from .kv_cache import KVCache  # noqa: F401
from .llama import LlamaModel  # noqa: F401
from .loader import LoadedModel, load_model  # noqa: F401
from .text import reference_text, reference_text_ids  # noqa: F401
from .tokenizer import Tokenizer  # noqa: F401
from .weights import LayerWeights, LlamaWeights  # noqa: F401
