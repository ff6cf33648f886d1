"""Tool calling: conventions, the grammar replies follow, and reading calls out of replies."""
