"""The dashboard's parts, which app.py (`streamlit run app.py`) puts on the page."""
