// Package predictor predicts an agent session's peak context, in tokens, before the session has
// run, so that the gateway can reserve it when the session is admitted.
//
// The gateway admits whole sessions against a token budget. In "peak" mode it charges each
// session its predicted peak context at its first call: an agent re-sends its growing
// conversation on every call, so the context a session will hold at its largest, not the first
// prompt, is what it will take from the cache. A prediction that is too low lets the working set
// outgrow the cache; one that is too high keeps sessions waiting for nothing. Only the order of
// the predictions has to be roughly right for size ordering, which is why quality is reported as
// a Spearman rank correlation (the Basin paper reports 0.64 on Terminal-Bench and 0.56 on
// SWE-bench Pro; those numbers come from a summary of the paper and are unverified).
//
// # Model
//
// Model is the paper's predictor: a ridge regression of log(peak context) on
//
//   - hashed TF-IDF features of the task text: the text is lowercased and split into words on
//     every rune that is neither a letter nor a digit; a word's count tf becomes 1+ln(tf); the word
//     is hashed with 64-bit FNV-1a into one of Dim buckets (hash mod Dim), with a sign from the
//     hash's top bit so that colliding words tend to cancel rather than add up; each bucket is
//     multiplied by its IDF, learned at training time as ln((1+n)/(1+df))+1 over the n training
//     texts, df of them touching the bucket, and the vector is L2-normalised;
//   - ln(1+task characters) and ln(1+first prompt tokens), standardised with the mean and standard
//     deviation of the training set;
//   - an unpenalised bias.
//
// Words only, no bigrams: training sets are small (the paper's Terminal-Bench set is 216
// trajectories), and bigrams multiply the distinct terms several-fold, so each one is seen in few
// texts and gets a weight fit to noise, while their share of the L2 norm dilutes the words that do
// carry signal. On the synthetic workload of the tests (600 samples, random word order, which is
// unfair to bigrams) adding bigrams cut the holdout Spearman from 0.91 to 0.77. Real task texts
// may reward bigrams once there are thousands of them; that would be a new model version.
//
// The prediction is exp of the regression, rounded and clamped to [first prompt, MaxPeak]: a
// session's context never shrinks below its first prompt.
//
// Traces never carry text (basin's trace format keeps task_chars and no text), so a model trained
// from traces has an all-zero TF-IDF part and predicts from the two lengths alone; it still
// accepts text at prediction time and ignores it. Samples with and without text mix: one without
// text contributes only its lengths.
//
// # Training
//
// Train fits a Model offline from finished sessions (Sample; SamplesFromTrace builds them from
// recorded traces). It holds out a deterministic share of the samples (20% by default, chosen by
// a hash of each sample's index and a seed) and reports the rank correlation on them. With too
// few samples to hold out (fewer than TrainOptions.MinHoldout would be held out, as with a single
// session) it fits on all of them and sets Report.HoldoutSkipped instead of failing: the model
// works but is unmeasured. The same samples and options give a byte-identical model file.
//
// A Model is saved as versioned JSON (see Model for the schema) and validated when read: every
// error names the field at fault. A Model is immutable after Train or Read and safe for
// concurrent use.
//
// # Fallback
//
// Fallback serves when no model is loaded. It keeps the last Window observed peaks and predicts
// their Quantile (0.9 by default), never less than the first prompt; before it has seen any peak it
// predicts Multiplier (4 by default) times the first prompt.
//
// Both satisfy Predictor, the one method the gateway needs.
package predictor
