"""The strict base model every config section derives from."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
