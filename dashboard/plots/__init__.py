"""Pure Plotly figure functions (numpy in, ``go.Figure`` out). Never import streamlit here."""
