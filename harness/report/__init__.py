"""Reports: signed bundles (in-toto + DSSE, Ed25519), the signing key, co-signatures and keyrings, rendering
(Markdown, HTML, CSV, SVG, JUnit), the comparison of two runs and the evidence library. A pure function of a
bundle's files and its signed predicate."""
