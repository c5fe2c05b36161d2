#include <sqlite3.h>

/* sqlite3_config is variadic, which Swift cannot call: one wrapper per option used. */
static inline int ubiquity_sqlite_set_statement_journal_spill(int bytes) {
    return sqlite3_config(SQLITE_CONFIG_STMTJRNL_SPILL, bytes);
}
