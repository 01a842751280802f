"""What couples the openrlhf backend to OpenRLHF 0.11.2's source: its entry run as it ships (``entry``), its
functions run with some names answered differently (``rebind``) and the digests of every piece relied on
(``audit``). When OpenRLHF moves, this folder is re-checked first (docs/openrlhf_backend.md, "Upgrading OpenRLHF")."""
