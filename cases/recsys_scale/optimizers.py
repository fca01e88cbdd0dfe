"""The case's optimizer: Adagrad everywhere, the user table at a learning rate of its own.

TensorFlow is imported only when the TF2 optimizer is built, so the case imports anywhere.
"""
LEARNING_RATE, ACCUMULATOR = 0.1, 0.1
TABLE_RATES = {"user": 0.05}    # table -> its own learning rate


def table_rates_adagrad(table_rates=None, dropped_first_row_of=None):
    """A legacy Keras Adagrad that trains the tables named in `table_rates` (table -> rate) at
    their own rate, as the TF2 rewrite does on CPU (a TPU would use `TableConfig.optimizer`).
    `dropped_first_row_of` (a table name) is a mistake: its sparse update skips the first row
    of every step's gradient (an off-by-one slice)."""
    import tensorflow as tf

    rates = dict(TABLE_RATES if table_rates is None else table_rates)

    class TableRatesAdagrad(tf.keras.optimizers.legacy.Adagrad):
        def _table(self, var):
            name = var.name.split(":")[0]
            return next((t for t in (*rates, dropped_first_row_of) if t and
                         name.endswith(f"/{t}")), None)

        def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
            table = self._table(var)
            if table in rates:
                key = (var.device, var.dtype.base_dtype)
                coefficients = dict((apply_state or {}).get(key)
                                    or self._fallback_apply_state(*key))
                coefficients["lr_t"] = tf.constant(rates[table], var.dtype.base_dtype)
                apply_state = {key: coefficients}
            if table is not None and table == dropped_first_row_of:
                grad, indices = grad[1:], indices[1:]
            return super()._resource_apply_sparse(grad, var, indices, apply_state)

    return TableRatesAdagrad(LEARNING_RATE, ACCUMULATOR)
