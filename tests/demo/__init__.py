"""Tests of the example application, ``rota_demo``: its external pieces (no database
needed), its pricing table, and the demo run itself."""
