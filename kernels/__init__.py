"""One package per case study; each exposes the surface casebook.cases documents."""
