"""A `.litertlm` bundle's prompt template: LlmMetadata's `prompt_templates`, as LiteRT-LM
applies it to a text prompt.

LiteRT-LM's `PromptTemplates` has a prefix and a suffix per role (`user`, `model`,
`system`). A session with the template on (`create_session(apply_prompt_template=True)`,
`litert-lm run` without `--no-template`) tokenizes the start token's text, then the user
prefix and the prompt as one text, then, on the way to decoding, the user suffix and the
model prefix as one text (LiteRT-LM's `ApplyPromptTemplates`: the turn suffix is
`user.suffix + model.prefix`); the Conversation API builds its Jinja template from the
same fields. keras_hub's presets carry no template, so `save_decoder(prompt_template=...)`
takes one, as a mapping of roles to `{"prefix": ..., "suffix": ...}`, e.g. Gemma's:

```python
{
    "user": {"prefix": "<start_of_turn>user\\n", "suffix": "<end_of_turn>\\n"},
    "model": {"prefix": "<start_of_turn>model\\n"},
}
```

The check generates in the engine with the template on, against Keras's text of the same
token ids (`engine_ids`: the two texts tokenized apart, as the engine does; keras_hub's
`generate()` of the templated text where that gives the same ids).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ROLES = ("user", "model", "system")
AFFIXES = ("prefix", "suffix")


@dataclass(frozen=True)
class PromptTemplate:
    """The prefix and suffix of each role (empty strings where not given)."""

    user: tuple[str, str] = ("", "")
    model: tuple[str, str] = ("", "")
    system: tuple[str, str] = ("", "")

    def texts(self, prompt: str) -> tuple[str, str]:
        """The two texts the engine tokenizes for `prompt`, in turn (module docstring):
        the user prefix and the prompt, then the user suffix and the model prefix."""
        return self.user[0] + prompt, self.user[1] + self.model[0]

    def templated(self, prompt: str) -> str:
        """`prompt` as one templated text (the two `texts` joined)."""
        return "".join(self.texts(prompt))


def checked_prompt_template(template) -> PromptTemplate | None:
    """`template` (None, or roles to `{"prefix", "suffix"}` strings) checked, before any work.

    Raises:
        TypeError: `template` is not a mapping, a role's value not a mapping, or an affix
            not a string.
        ValueError: a role or affix LiteRT-LM's `PromptTemplates` does not have, or a
            template whose every affix is empty.
    """
    if template is None:
        return None
    if not isinstance(template, Mapping):
        raise TypeError(
            "prompt_template must be a mapping of roles (user, model, system) to "
            f"{{'prefix': ..., 'suffix': ...}}, got {type(template).__name__}."
        )
    roles = {}
    for role, affixes in template.items():
        if role not in ROLES:
            raise ValueError(
                f"prompt_template has role {role!r}; LiteRT-LM's PromptTemplates has {ROLES}."
            )
        if not isinstance(affixes, Mapping):
            raise TypeError(
                f"prompt_template[{role!r}] must be a mapping of 'prefix' / 'suffix' to "
                f"strings, got {type(affixes).__name__}."
            )
        for name, text in affixes.items():
            if name not in AFFIXES:
                raise ValueError(f"prompt_template[{role!r}] has {name!r}; a role has {AFFIXES}.")
            if not isinstance(text, str):
                raise TypeError(
                    f"prompt_template[{role!r}][{name!r}] must be a string, got "
                    f"{type(text).__name__}."
                )
        roles[role] = (affixes.get("prefix", ""), affixes.get("suffix", ""))
    checked = PromptTemplate(**roles)
    if not any(text for role in ROLES for text in getattr(checked, role)):
        raise ValueError("prompt_template has no text: give a prefix or suffix, or None.")
    return checked


def write_prompt_templates(metadata, template: PromptTemplate | None) -> None:
    """Sets LlmMetadata `metadata`'s `prompt_templates` to `template` (nothing for None)."""
    if template is None:
        return
    for role in ROLES:
        prefix, suffix = getattr(template, role)
        if prefix or suffix:
            affixes = getattr(metadata.prompt_templates, role)
            affixes.prefix, affixes.suffix = prefix, suffix


def engine_ids(tokenizer, template: PromptTemplate | None, prompt: str, start) -> list[int]:
    """The ids the engine prefills for `prompt`: the start token (where there is one), then
    each of `template.texts(prompt)` tokenized apart (without a template, the prompt)."""
    import numpy as np

    texts = (prompt,) if template is None else template.texts(prompt)
    ids = [] if start is None else [int(start)]
    for text in texts:
        if text:
            ids += [int(i) for i in np.asarray(tokenizer(text)).reshape(-1)]
    return ids
