"""The shared typed-config loader: dicts and key=value overrides into checked dataclasses."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from infra.common.typed_config import (
    ConfigError,
    apply_overrides,
    from_dict,
    merge,
    parse_overrides,
    validate_section,
)


@dataclass
class Inner:
    lr: float = 1e-3
    sizes: tuple[int, ...] = (64, 64)


@dataclass
class Outer:
    mode: Literal["a", "b"] = "a"
    limit: int | None = None
    flag: bool = False
    inner: Inner = field(default_factory=Inner)


def test_overrides_reach_nested_sections_with_typed_values() -> None:
    base = Outer()
    cfg = apply_overrides(base, ["mode=b", "limit=3", "flag=true", "inner.lr=3e-4", "inner.sizes=[8,16]"])
    assert cfg == Outer("b", 3, True, Inner(3e-4, (8, 16)))
    assert base == Outer()  # the original is left as it was
    assert apply_overrides(cfg, ["limit=null"]).limit is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("inner.lrr=1", r"unknown config key\(s\) \['lrr'\] in section 'inner'; valid keys: lr, sizes"),
        ("mode=c", r"mode='c' is not a valid choice; valid: a, b"),
        ("limit=2.5", r"limit=2.5 must be an integer"),
        ("flag=1", r"flag=1 must be true or false"),
        ("inner=3", r"inner must be a mapping of Inner fields"),
        ("limit", r"must look like key=value"),
    ],
)
def test_bad_overrides_name_the_key_and_the_fix(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_overrides(Outer(), [override])


def test_merge_lays_sections_over_each_other_without_mutating() -> None:
    base = {"inner": {"lr": 1.0, "sizes": [1]}, "mode": "a"}
    extra = parse_overrides(["inner.lr=2e-3"])
    merged = merge(base, extra)
    assert merged == {"inner": {"lr": 2e-3, "sizes": [1]}, "mode": "a"}
    assert base["inner"]["lr"] == 1.0
    assert from_dict(Outer, merged).inner == Inner(2e-3, (1,))
    with pytest.raises(ConfigError, match="'inner' is a value, not a section"):
        parse_overrides(["inner=1", "inner.lr=2"])


@dataclass
class Checked:
    low: int = 0
    high: int = 1

    def validate(self) -> None:
        if self.low > self.high:
            raise ConfigError(f"low={self.low} exceeds high={self.high}; lower low or raise high")


@dataclass
class Holder:
    checked: Checked = field(default_factory=Checked)


def test_every_dataclass_built_from_a_dict_runs_its_own_validate() -> None:
    with pytest.raises(ConfigError, match="low=5 exceeds high=1"):
        from_dict(Checked, {"low": 5})
    with pytest.raises(ConfigError, match="low=5 exceeds high=1"):  # a section is checked where it enters
        apply_overrides(Holder(), ["checked.low=5"])
    assert apply_overrides(Holder(), ["checked.low=1"]).checked == Checked(1, 1)


@dataclass
class Plain:
    """A section of a package that cannot import ConfigError (sims, policies, rlcore): plain ValueError."""

    rate: float = 0.5

    def validate(self) -> None:
        if not 0 <= self.rate <= 1:
            raise ValueError(f"rate={self.rate} must be in [0, 1]")


@dataclass
class PlainHolder:
    plain: Plain = field(default_factory=Plain)
    checked: Checked = field(default_factory=Checked)


def test_a_plain_value_error_of_a_section_becomes_a_config_error_naming_its_path() -> None:
    with pytest.raises(ConfigError, match=r"^plain\.rate=2\.0 must be in \[0, 1\]$"):
        apply_overrides(PlainHolder(), ["plain.rate=2.0"])
    with pytest.raises(ConfigError, match=r"^rate=2\.0 must be in \[0, 1\]$"):  # the top level has no path
        from_dict(Plain, {"rate": 2.0})
    with pytest.raises(ConfigError, match=r"^low=5 exceeds high=1"):  # a ConfigError is passed on unchanged
        apply_overrides(PlainHolder(), ["checked.low=5"])
    with pytest.raises(ConfigError, match=r"^sec\.rate=-1 must be in \[0, 1\]$"):
        validate_section(Plain(rate=-1), "sec")
