"""Refuse an organization name that is not a plain name before cookiecutter makes a folder of it.

`invoke new-tenant --org=...` checks the name itself (fmcluster.scaffold); this covers the interactive
prompts, whose answers reach the folder name without passing through fmcluster first.
"""

import re
import sys

ORG = {{ cookiecutter.org | tojson }}

if not re.fullmatch(r"[a-z](?:[a-z0-9]|-(?=[a-z0-9])){1,23}", ORG):
    sys.stderr.write(f"org {ORG!r} is not a tenant name: use 2-24 lower-case letters, digits and single dashes, "
                     "starting with a letter\n")
    sys.exit(1)
