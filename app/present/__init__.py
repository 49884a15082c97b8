"""What the dashboard shows, as plain functions (no Streamlit, no torch; the tests call them directly): text
for people and for Markdown (text.py), Plotly figures (figures.py), seed groups as mean ± std (seed_groups.py),
the New run form's fields walked from RunSpec (form_schema.py) and its rules (form_rules.py), what the New run
page says before Launch (new_run_hints.py), the built-in datasets' previews (builtin_datasets.py).

The Streamlit code that uses them is in app/ui/ and app/app_pages/."""
