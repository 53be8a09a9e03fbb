"""Export a keras_hub Gemma 3 with its tokenizer as a LiteRT-LM bundle, then chat with it
through Google's on-device LLM runtime (the Python `litert_lm` engine).

Nothing is downloaded: a SentencePiece tokenizer is trained here on a few sentences, a tiny
text-only Gemma 3 (2 layers, width 64) learns them for a few seconds, `save_decoder(...,
formats=("litertlm",))` writes `model.litertlm` (the model, the tokenizer and the LLM
metadata: docs/litertlm.md) after LiteRT-LM's engine has generated keras_hub's greedy text
from it, and the engine completes a few prompts, each printed beside keras_hub's
`generate()`:

    python examples/litertlm_chat.py                    # files in a temporary folder
    python examples/litertlm_chat.py --out gemma3_chat  # keep model.litertlm in ./gemma3_chat
    litert-lm run gemma3_chat/model.litertlm --no-template --cache no --top-k 1 \\
        --prompt "the quick brown"

Needs `pip install "keras-posenc[litertlm]"` (x86-64 Linux) and TensorFlow (the converter).
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the LiteRT converter reads TF graphs

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a small model says hello to the world",
    "keras exports decoders to many runtimes",
    "one two three four five six seven eight nine ten",
]
PROMPTS = ["the quick brown", "a small model", "one two three"]
MAX_LENGTH = 40


def train_tokenizer():
    """A Gemma 3 tokenizer whose SentencePiece model is trained on `SENTENCES` (Gemma's
    special tokens: `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3)."""
    import keras_hub
    import sentencepiece

    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 20),
        model_writer=proto,
        vocab_size=60,
        model_type="unigram",
        hard_vocab_limit=False,  # four sentences hold fewer pieces: take what they have
        minloglevel=2,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        bos_piece="<bos>",
        eos_piece="<eos>",
    )
    return keras_hub.models.Gemma3Tokenizer(proto=proto.getvalue(), has_vision_tokens=False)


def trained_gemma3(epochs: int = 60):
    """A 2-layer text-only Gemma 3 CausalLM fitted to `SENTENCES` (float32)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    tokenizer = train_tokenizer()
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        image_size=16,  # required, unused without a vision encoder
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        head_dim=16,
        sliding_window_size=8,
    )
    preprocessor = keras_hub.models.Gemma3CausalLMPreprocessor(tokenizer, sequence_length=16)
    causal_lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=preprocessor)
    causal_lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    # Gemma 3's preprocessor takes prompts and responses: the loss is on the responses.
    prompts = [" ".join(s.split()[:3]) for s in SENTENCES]
    responses = [" " + " ".join(s.split()[3:]) for s in SENTENCES]
    pairs = {"prompts": prompts * 4, "responses": responses * 4}
    causal_lm.fit(x=pairs, batch_size=4, epochs=epochs, verbose=0)
    return causal_lm


def chat(bundle: Path, prompts: Sequence[str]) -> list[str]:
    """Each prompt's greedy completion by LiteRT-LM's engine (CPU, top_k 1, no template)."""
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    greedy = litert_lm.SamplerConfig(top_k=1)
    with (
        tempfile.TemporaryDirectory() as cache,  # the engine's XNNPACK cache, not beside it
        litert_lm.Engine(str(bundle), cache_dir=cache) as engine,
    ):
        texts = []
        for prompt in prompts:
            with engine.create_session(apply_prompt_template=False, sampler_config=greedy) as s:
                s.run_prefill([prompt])
                texts.append(s.run_decode().texts[0])
    return texts


def main(argv: Sequence[str] | None = None) -> dict:
    """Trains, exports and chats; returns `{"bundle", "litert_lm", "keras_hub"}` (the
    texts per prompt)."""
    from keras_posenc.export import save_decoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for model.litertlm (default: a temporary one)")
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.out) if args.out else Path(temporary) / "gemma3_chat"
        causal_lm = trained_gemma3(args.epochs)
        save_decoder(causal_lm, folder, max_length=MAX_LENGTH, formats=("litertlm",), verbose=0)
        bundle = folder / "model.litertlm"
        engine_texts = chat(bundle, PROMPTS)
        causal_lm.compile(sampler="greedy")
        keras_texts = [
            str(causal_lm.generate(p, max_length=MAX_LENGTH, strip_prompt=True)) for p in PROMPTS
        ]
        for prompt, text, expected in zip(PROMPTS, engine_texts, keras_texts, strict=True):
            print(f"{prompt!r} -> LiteRT-LM {text!r} (keras_hub {expected!r})")
        print(f"{bundle}: {bundle.stat().st_size} bytes")
        return {"bundle": str(bundle), "litert_lm": engine_texts, "keras_hub": keras_texts}


if __name__ == "__main__":
    main()
