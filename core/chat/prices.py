"""What a model call costs: its tokens at LiteLLM's list prices (issue 39, "Usage and cost").

LiteLLM's local price list (`litellm.model_cost`, LITELLM_LOCAL_MODEL_COST_MAP) is read once per model per
process; then a call's cost is two multiplications. The demo model and models the list lacks have no price
(None). Tiered, cached-token and per-request prices are left out: this is the list price of the tokens counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core.chat.llm_stream import ModelResult

__all__ = ["priced"]

#: Each model's (input, output) price per token from LiteLLM's price list, or None: looked up once per model.
_PRICES: dict[str, tuple[float, float] | None] = {}


def priced(litellm: Any, result: ModelResult) -> ModelResult:
    """`result` with the call's cost, when LiteLLM's price list has the model (see the module docstring)."""
    if result.model not in _PRICES:
        _PRICES[result.model] = _price_of(litellm, result.model)
    prices = _PRICES[result.model]
    if prices is None:
        return result
    usage = result.usage
    cost = usage.input_tokens * prices[0] + usage.output_tokens * prices[1]
    return dataclasses.replace(result, usage=dataclasses.replace(usage, cost_usd=cost))


def _price_of(litellm: Any, model: str) -> tuple[float, float] | None:
    if model.startswith("local/"):  # the demo model (`core.chat.llm.DEMO_PROVIDER`)
        return None
    table = getattr(litellm, "model_cost", None) or {}
    entry = table.get(model) or (table.get(model.split("/", 1)[1]) if "/" in model else None)
    if not isinstance(entry, dict):
        return None
    price_in, price_out = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
    if not isinstance(price_in, int | float) or not isinstance(price_out, int | float):
        return None
    return float(price_in), float(price_out)
