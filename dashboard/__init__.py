"""attnscope dashboard: Streamlit pages over core's AttentionTrace (run: streamlit run dashboard/app.py)."""
