"""The types of the remediator's settings, as pydantic checks them: a config file or flag
that says ``max_per_cycle: three``, ``-1``, ``dry_run: "no"`` or a namespace list given
as one string is refused with the key, the value and what is allowed — never read as
something else. The settings themselves stay plain frozen dataclasses."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints

FORBID_EXTRA = ConfigDict(extra="forbid")  # an unknown key is an error, not ignored
Count = Annotated[int, Field(ge=0, strict=True)]
Flag = Annotated[bool, Field(strict=True)]
Seconds = Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)]
Factor = Annotated[float, Field(ge=1, strict=True, allow_inf_nan=False)]
Ratio = Annotated[float, Field(ge=0, le=1, strict=True)]
Text = Annotated[str, Field(strict=True)]
Names = tuple[Annotated[str, StringConstraints(min_length=1, strict=True)], ...]
# a PromQL duration: 90s, 10m, 1h30m
Duration = Annotated[str, StringConstraints(pattern=r"^([0-9]+(ms|s|m|h|d|w|y))+$", strict=True)]
