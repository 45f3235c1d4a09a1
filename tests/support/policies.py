"""A test's Policy: the choosing step's thresholds changed for one test, as Policy.from_config
builds it from the Config for every decision (tf_mpt.choose.policy)."""

import dataclasses

from tf_mpt.choose import policy as _policy


def with_fields(monkeypatch, **fields):
    """Every Policy built from a Config in this test has `fields` (Policy field: value)."""
    unknown = set(fields) - {f.name for f in dataclasses.fields(_policy.Policy)}
    assert not unknown, f"not Policy fields: {sorted(unknown)}"
    built = _policy.Policy.from_config.__func__

    def from_config(cls, config):
        return dataclasses.replace(built(cls, config), **fields)
    monkeypatch.setattr(_policy.Policy, "from_config", classmethod(from_config))
