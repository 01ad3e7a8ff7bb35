"""The offline GPU and TPU hosts: what they are given, and what comes back from them.

- ``wheelhouse``: the bundle's wheels, built here;
- ``host_install``: the bundle installed there (standard library only);
- ``gpu_window``: one short, budgeted run on an accelerator host;
- ``carry``: which of an earlier window's records a continuing window keeps;
- ``archive``: a host's records packed there, checked and imported here.
"""
