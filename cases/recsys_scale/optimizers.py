"""The case's optimizer: Adagrad everywhere, the user table at a learning rate of its own.

TensorFlow is imported only when the TF2 optimizer is built, so the case imports anywhere.
"""
LEARNING_RATE, ACCUMULATOR = 0.1, 0.1
TABLE_RATES = {"user": 0.05}    # table -> its own learning rate


def table_rates_adagrad(table_rates=None, skipped_row=None):
    """A legacy Keras Adagrad that trains the tables named in `table_rates` (table -> rate) at
    their own rate, as the TF2 rewrite does on CPU (a TPU would use `TableConfig.optimizer`).
    `skipped_row` = (table, row) is a mistake: the table's sparse update skips that row, as if
    it were a padding row."""
    import tensorflow as tf

    rates = dict(TABLE_RATES if table_rates is None else table_rates)

    class TableRatesAdagrad(tf.keras.optimizers.legacy.Adagrad):
        def _table(self, var):
            name = var.name.split(":")[0]
            skipped = (skipped_row[0],) if skipped_row else ()
            return next((t for t in (*rates, *skipped) if name.endswith(f"/{t}")), None)

        def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
            table = self._table(var)
            if table in rates:
                key = (var.device, var.dtype.base_dtype)
                coefficients = dict((apply_state or {}).get(key)
                                    or self._fallback_apply_state(*key))
                coefficients["lr_t"] = tf.constant(rates[table], var.dtype.base_dtype)
                apply_state = {key: coefficients}
            if skipped_row and table == skipped_row[0]:
                kept = tf.not_equal(indices, tf.cast(skipped_row[1], indices.dtype))
                grad, indices = tf.boolean_mask(grad, kept), tf.boolean_mask(indices, kept)
            return super()._resource_apply_sparse(grad, var, indices, apply_state)

    return TableRatesAdagrad(LEARNING_RATE, ACCUMULATOR)
