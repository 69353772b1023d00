"""Every session-state key of the dashboard, in one place, grouped by where its widget lives.

A widget's ``key=`` is its value's name in ``st.session_state``; pages and tests read and set them
through these constants (``from dashboard import keys as K``). Keys that start with ``_`` hold
bookkeeping, not a widget. Chart and download-button keys only name an element and stay local.
"""

# -- sidebar --------------------------------------------------------------------------------------
MODEL = "model"
DEVICE = "device"
BATCH = "batch"  # toggle: several inputs, one per line
SOURCE = "source"  # single input (text_input)
SOURCES = "sources"  # batch (text_area)
MODE = "mode"  # "generate" or "teacher forcing"
TARGET = "target"
TARGETS = "targets"
SELECTION = "selection"  # the Selection of this run (set by state.sidebar())
TEXT_FOR_MODEL = "_text_for_model"  # model whose examples fill the text boxes

# -- sidebar: your own model ----------------------------------------------------------------------
LOAD_PATH = "load_path"  # text_input: folder, weights file, adapter file or cached Hugging Face name
LOAD_PATH_BUTTON = "load_path_button"
UPLOADS = "uploads"  # file_uploader: a core checkpoint (files or one .zip)
LOAD_UPLOAD_BUTTON = "load_upload_button"
USER_MODELS = "_user_models"  # paths this session loaded (listed in the picker)
LOAD_MSG = "_load_msg"  # (level, text) of the last load attempt, shown once
UPLOAD_DIR = "_upload_dir"  # tempfile.TemporaryDirectory of this session's uploads

# -- sidebar: open a trace file (dashboard/opened.py) ---------------------------------------------
TRACE_UPLOAD = "trace_upload"  # file_uploader: a .npz / .json trace
TRACE_UPLOAD_BUTTON = "trace_upload_button"
TRACE_PATH = "trace_path"  # text_input: a trace file in an allowed folder
TRACE_PATH_BUTTON = "trace_path_button"
TRACE_CLOSE_BUTTON = "trace_close_button"
OPEN_TRACES = "_open_traces"  # {digest: OpenTrace} opened in this session (newest last)
TRACE = "_trace"  # digest of the trace shown instead of a model (None: the sidebar's model)
TRACE_MSG = "_trace_msg"  # (level, text) of the last open attempt, shown once
TRACE_BOX_USED = "_trace_box_used"  # the Open-a-trace box was used: keep it unfolded
VIEW_DONE = "_view_done"  # this session already opened the trace `attnscope view FILE` serves

# -- sidebar: open a run folder (dashboard/watched.py) --------------------------------------------
RUN_PATH = "run_path"  # text_input: a run folder (attnscope.watch) in an allowed folder
RUN_PATH_BUTTON = "run_path_button"
RUN_CLOSE_BUTTON = "run_close_button"
RUN = "_run"  # the open run folder's path (str; None: no run open), shown on Training and Compare
RUN_MSG = "_run_msg"  # (level, text) of the last open attempt, shown once
RUN_BOX_USED = "_run_box_used"  # the Open-a-run box was used: keep it unfolded
RUN_VIEW_DONE = "_run_view_done"  # this session already opened the run `attnscope view FOLDER` serves
RUN_GOTO = "_run_goto"  # a run was just opened: show the Training page

# -- links (dashboard/links.py) -------------------------------------------------------------------
LINK_APPLIED = "_link_applied"  # this session already read the URL's parameters
LINK_TEXT = "_link_text"  # the input came from the link: the model's examples must not replace it
LINK_VALUES = "_link_values"  # {key: (parameter, value)} the link set, checked once the page ran

# -- Attention ------------------------------------------------------------------------------------
ATT_KIND = "att_kind"
ATT_SEQ = "att_seq"
ATT_LAYER = "att_layer"
ATT_HEAD = "att_head"
ATT_LOG = "att_log"
ATT_MASK = "att_mask"
ATT_AGG = "att_agg"
ATT_SHOW = "att_moves_mode"  # weight | moves: the Attention page's toggle
ATT_GRID = "att_grid"  # plotly selection of the grid
ATT_GRID_APPLIED = "_att_grid_applied"  # last grid click already copied into the selectors

# -- Decoding -------------------------------------------------------------------------------------
DEC_SEQ = "dec_seq"
DEC_STEP = "dec_step"
DEC_LAYER = "dec_layer"
DEC_LOG = "dec_log"

# -- Masks ----------------------------------------------------------------------------------------
MASK_SEQ = "mask_seq"
MASK_LAYER = "mask_layer"

# -- Positional encoding --------------------------------------------------------------------------
PE_SOURCE = "pe_source"
PE_DMODEL = "pe_d_model"
PE_MAXLEN = "pe_max_len"
PE_DIMS = "pe_dims"

# -- bertviz --------------------------------------------------------------------------------------
BV_VIEW = "bv_view"
BV_KINDS = "bv_kinds"
BV_SEQ = "bv_seq"
BV_PAD = "bv_drop_pad"
BV_LAYERS = "bv_layers"  # include_layers (empty: all, or the first for long inputs)
BV_HEADS = "bv_heads"  # include_heads (empty: all that fit)

# -- Mask audit -----------------------------------------------------------------------------------
AUD_KIND = "aud_kind"
AUD_SEQ = "aud_seq"
AUD_LAYER = "aud_layer"
AUD_HEAD = "aud_head"
AUD_CHART = "aud_chart"  # plotly selection of the masked-mass heatmap
AUD_CLICK_APPLIED = "_aud_click_applied"

# -- Mask lab -------------------------------------------------------------------------------------
LAB_BUG = "lab_bug"
LAB_PAD = "lab_pad"  # add a shorter copy of a single input, so the batch has padding
LAB_KIND = "lab_kind"
LAB_SEQ = "lab_seq"
LAB_LAYER = "lab_layer"
LAB_HEAD = "lab_head"
LAB_VIEW = "lab_view"  # the open tab: what the bug changes, or the two attention maps (words.LAB_VIEWS)
LAB_KIND_FOR_BUG = "_lab_kind_for_bug"  # the bug whose most-changed kind was last put in the selector

# -- Head analytics -------------------------------------------------------------------------------
HA_KIND = "ha_kind"
HA_STAT = "ha_stat"
HA_SEQ = "ha_seq"
HA_LAYER = "ha_layer"
HA_HEAD = "ha_head"
HA_CHART = "ha_stat_chart"  # plotly selection of the statistic heatmap
HA_TABLE = "ha_table"  # row selection of the table
HA_ROLL_LAYER = "ha_roll_layer"
HA_ATTR_ENCODER = "ha_attr_encoder"
HA_AL_LAYER = "ha_al_layer"
HA_AL_HEAD = "ha_al_head"
HA_CLICK_APPLIED = "_ha_click_applied"
HA_RECORDS = "_ha_records"  # the table's rows of the last run (a table click refers to them)

# -- Compare --------------------------------------------------------------------------------------
CMP_MODE = "cmp_mode"
CMP_SOURCE_B = "cmp_source_b"
CMP_TARGET_B = "cmp_target_b"
CMP_MODEL_B = "cmp_model_b"
CMP_BUG = "cmp_bug"
CMP_OFF = "cmp_off"  # heads switched off (multiselect of "kind · layer l · head h")
CMP_KIND = "cmp_kind"
CMP_SEQ = "cmp_seq"
CMP_LAYER = "cmp_layer"
CMP_HEAD = "cmp_head"
CMP_CHART = "cmp_head_diff_chart"
CMP_B_FOR_MODEL = "_cmp_b_for_model"  # model whose example fills input B
CMP_CLICK_APPLIED = "_cmp_click_applied"
CMP_AUTO_FOR = "_cmp_auto_for"  # the B whose most-changed head was last put in the selectors
CMP_STEP_B = "cmp_step_b"  # "another training step": the step B shows
CMP_RUN_A = "cmp_run_a"  # "two steps of the run": the step A shows
CMP_RUN_B = "cmp_run_b"  # and the step B shows

# Training (a zoo model's snapshots, or the open run: the same kind and step widgets)
TRAIN_KIND = "train_kind"
TRAIN_STEP = "train_step"
TRAIN_PROBE = "train_probe"  # which of the run's probe inputs
TRAIN_LATEST = "_train_latest"  # (run path, newest step) the slider saw last: on it, the slider follows

# Head analytics over a corpus (dashboard/corpus_view.py)
HA_CORPUS = "ha_corpus"  # {"frame", "meta", "name"} of the open stats file, or None
HA_CORPUS_MSG = "_ha_corpus_msg"
HA_CORPUS_UPLOAD = "ha_corpus_upload"
HA_CORPUS_UPLOAD_BUTTON = "ha_corpus_upload_button"
HA_CORPUS_PATH = "ha_corpus_path"
HA_CORPUS_PATH_BUTTON = "ha_corpus_path_button"
HA_CORPUS_CLOSE = "ha_corpus_close"
HA_C_KIND = "ha_c_kind"
HA_C_STAT = "ha_c_stat"
HA_C_LAYER = "ha_c_layer"
HA_C_HEAD = "ha_c_head"
HA_C_CHART = "ha_c_chart"
HA_C_CLICK_APPLIED = "_ha_c_click_applied"
HA_C_TRACE = "ha_c_trace"  # prefix of the "Trace" buttons of the atypical inputs
HA_C_PICKED = "_ha_c_picked"
