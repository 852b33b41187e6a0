"""The official GPT-2 models: their sizes, the files each source serves, where they come from and where they go.

Where files go: <models-dir>/<SIZE>/ for OpenAI's TensorFlow checkpoint, <models-dir>/<SIZE>-hf/ for Hugging Face's
safetensors (the two layouts live apart, so loading a folder never has to guess between them). The models dir is
--models-dir, else $GPT2_NUMPY_WEIGHTS, else ./weights (gpt2_numpy/loading.py: where); nothing is ever written
inside the installed package.

Where a file comes from: Source.url, or a mirror (gpt2_numpy/fetch.py: file_url).
"""
from dataclasses import dataclass

MODEL_SIZES = ("124M", "355M", "774M", "1558M")
HF_REPOS = {
    "124M": "openai-community/gpt2",
    "355M": "openai-community/gpt2-medium",
    "774M": "openai-community/gpt2-large",
    "1558M": "openai-community/gpt2-xl",
}
# the published shapes of the four sizes (OpenAI's hparams.json files); every one has a 1024-token context
OFFICIAL_HPARAMS = {
    size: {"n_vocab": 50257, "n_ctx": 1024, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer}
    for size, (n_layer, n_embd, n_head) in {"124M": (12, 768, 12), "355M": (24, 1024, 16), "774M": (36, 1280, 20),
                                            "1558M": (48, 1600, 25)}.items()
}


@dataclass(frozen=True)
class Source:
    folder_suffix: str
    files: tuple  # small files first, so a wrong URL fails before the big download starts
    url: str  # default URL, formatted with size, repo and name
    hparams: str  # which of the files holds the hyperparameters
    vocabulary: tuple  # which hold the tokenizer: (token ids, merges)


SOURCES = {
    "openai": Source(
        folder_suffix="",
        files=("checkpoint", "hparams.json", "encoder.json", "vocab.bpe", "model.ckpt.index",
               "model.ckpt.data-00000-of-00001"),
        url="https://openaipublic.blob.core.windows.net/gpt-2/models/{size}/{name}",
        hparams="hparams.json",
        vocabulary=("encoder.json", "vocab.bpe"),
    ),
    "huggingface": Source(
        folder_suffix="-hf",
        files=("config.json", "vocab.json", "merges.txt", "model.safetensors"),
        url="https://huggingface.co/{repo}/resolve/main/{name}",
        hparams="config.json",
        vocabulary=("vocab.json", "merges.txt"),
    ),
}
