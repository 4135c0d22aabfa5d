"""MkDocs hook: the reference pages' generated parts must equal what the code says (filled in below)."""
