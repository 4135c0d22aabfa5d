"""The manual and the READMEs checked against the code: design pages, references, links, examples."""
