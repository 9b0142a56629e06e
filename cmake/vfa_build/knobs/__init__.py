"""The declaration's Python side: knob tables and checks (knobs.py), its JSON Schema (schema.py), the op schemas check."""
