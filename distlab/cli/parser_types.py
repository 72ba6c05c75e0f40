"""distlab's domains registered with jsonargparse: the parser checks each option against the same declaration a
Python caller's ``check_domains`` does, and hands the class a plain ``int`` / ``float`` / ``str``."""

from __future__ import annotations

from jsonargparse.typing import register_type

from distlab.domains import DOMAINS

for _domain in DOMAINS:
    # the domain's own call checks (ValueError saying why) and returns the plain value
    register_type(_domain, _domain.base, deserializer=_domain, fail_already_registered=False)
