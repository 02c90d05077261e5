"""Every knob of the plugin, defined once and resolved once: command line > environment > ini >
default.

:data:`OPTIONS` (``options``) is the single definition the plugin turns into ``parser.addoption``
and ``parser.addini`` calls; each value's parser (``values``) says what it allows; :func:`resolve`
(``resolve``) turns the raw values into a frozen :class:`Settings`, and a bad value is a
:class:`~pytest_specdecode.errors.ConfigError` that says which value, from where (flag,
environment variable or ini file), and what is allowed.
"""

from pytest_specdecode.settings.options import (
    OPTIONS,
    OPTIONS_BY_NAME,
    OTHER_ENV_VARS,
    Option,
    options_table,
    unknown_env_warnings,
)
from pytest_specdecode.settings.resolve import (
    DEFAULT_CONFIG,
    Settings,
    find_project_root,
    project_test_id,
    resolve,
)
from pytest_specdecode.settings.values import (
    INCONCLUSIVE_POLICIES,
    METHODS,
    MISSING_BASELINE_POLICIES,
    ServerHosts,
    default_state_dir,
)

__all__ = [
    "DEFAULT_CONFIG",
    "INCONCLUSIVE_POLICIES",
    "METHODS",
    "MISSING_BASELINE_POLICIES",
    "OPTIONS",
    "OPTIONS_BY_NAME",
    "OTHER_ENV_VARS",
    "Option",
    "ServerHosts",
    "Settings",
    "default_state_dir",
    "find_project_root",
    "options_table",
    "project_test_id",
    "resolve",
    "unknown_env_warnings",
]
