"""Render the copy of `loadpolicy/policy.py` that the patch series adds to transformers.

There is one source of truth for the policy. transformers cannot import our package, so the first patch of the series
adds `TRANSFORMERS_MODULE` with exactly `render_transformers_module(policy.py)`; a test compares the two and fails on
drift. The copy differs from the source only by the header below.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


TRANSFORMERS_MODULE = "src/transformers/integrations/load_policy.py"
SOURCE = Path(__file__).resolve().parent.parent / "policy.py"

_HEADER = """\
# Copyright 2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Generated from loadpolicy's `src/loadpolicy/policy.py`: edit it there and regenerate, not here.
"""


class NotCarriableError(ValueError):
    """The policy source uses something a module inside transformers cannot."""


def check_carriable(source: str) -> None:
    """Refuse a policy source that imports anything but the standard library, or needs a newer Python than 3.11."""
    tree = ast.parse(source, feature_version=(3, 11))
    stdlib = sys.stdlib_module_names | {"__future__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise NotCarriableError(f"line {node.lineno}: relative import; the carried module must stand alone")
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name.partition(".")[0] not in stdlib:
                raise NotCarriableError(f"line {node.lineno}: imports {name!r}; only the standard library is allowed")


def render_transformers_module(source: str) -> str:
    check_carriable(source)
    return _HEADER + source
