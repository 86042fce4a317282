"""A VM spec on a container-only site: the fix names the site setting that
allows VMs, kinds=container,vm (issue 32, item 14a)."""

from __future__ import annotations

import pytest

from hpvc.errors import InputError
from hpvc.slurm import policy

SPEC = 'name = "v"\nkind = "vm"\nimage = "hpc"\n\n[[nodes]]\nrole = "head"\n'


def test_a_vm_spec_on_a_container_site_names_kinds_container_vm() -> None:
    with pytest.raises(InputError) as e:
        policy.load(SPEC, "t", policy.Site())
    line = e.value.line()
    assert "only in container nodes" in line
    assert 'kind = "container"' in line
    assert "kinds=container,vm in plugstack.conf" in line


def test_the_named_setting_lets_the_spec_through() -> None:
    assert policy.load(SPEC, "t", policy.Site.parse(["kinds=container,vm"]))[0].kind == "vm"
