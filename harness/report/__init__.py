"""Reports: signed bundles (in-toto + DSSE, Ed25519), the signing key, rendering (Markdown, HTML, CSV, SVG,
JUnit) and the comparison of two runs. A pure function of a bundle's files and its signed predicate."""
