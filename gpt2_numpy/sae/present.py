"""What the SAE's command lines print, as tables and as JSON (their numbers come from the rest of the package):

    gpt2-numpy sae eval --sae my-sae --model my-gpt --data held-out.txt   eval_report: the losses, loss recovered, ...
    gpt2-numpy sae eval --transcoders my-tc --model my-gpt --data held-out.txt   transcoders_report: the same, per layer
    gpt2-numpy explain PROMPT --sae my-sae [--json]                  each position's strongest latents
    gpt2-numpy explain PROMPT --sae my-sae --sae-ablate F [F ...]    the loss and next tokens with latents taken out
    gpt2-numpy explain PROMPT --sae my-sae --steer F:SCALE [...]     ... with SCALE * W_dec[F] added at every position
    gpt2-numpy explain PROMPT --sae my-sae --attribute A B           each latent's share of logit(A) - logit(B)

explain's tables are latents_table(ids, result, label) and latents_json(ids, result, text) of features.explain_latents's
result; label(token_id) is a table's quoted label of a token, text(token_id) its text for JSON.
"""
import numpy as np

from gpt2_numpy.console import plural
from gpt2_numpy.interpret.present import before_after_json, before_after_table, ids_json
from gpt2_numpy.interpret.stepwise import fit

ATTRIBUTED = 20  # latents --attribute's table lists, the largest |attribution| first


def eval_report(numbers):  # -> the text sae eval prints of evaluation.evaluate's numbers
    recovered = numbers["loss_recovered"]
    return "\n".join([
        f"{numbers['tokens']:,} tokens, the SAE spliced in at {numbers['hook']}:",
        f"  L_clean {numbers['L_clean']:.4f}  L_sae {numbers['L_sae']:.4f}  L_zero {numbers['L_zero']:.4f} "
        "(nats per token)",
        f"  loss recovered {recovered:.4f} ((L_zero - L_sae) / (L_zero - L_clean))" if recovered is not None
        else "  loss recovered: undefined (zeroing the activation does not change the loss)",
        f"  mse {numbers['mse']:.6g}  explained variance {numbers['explained_variance']:.4f}  L0 {numbers['l0']:.2f}",
        f"  dead latents {numbers['dead_latents']:,} of {numbers['d_sae']:,} "
        f"({numbers['dead_latents'] / numbers['d_sae']:.1%}, none fired on this text)",
        "SAELens's metrics (its evals.py, on the activation the SAE reads):",
        f"  CE loss score {shown_number(numbers['loss_recovered'])}  KL div score "
        f"{shown_number(numbers['kl_div_score'])} (KL {numbers['kl_div_with_sae']:.4g} with the SAE, "
        f"{numbers['kl_div_with_ablation']:.4g} zeroed)",
        f"  cossim {numbers['cossim']:.4f}  l2 ratio {numbers['l2_ratio']:.4f}  relative reconstruction bias "
        f"{shown_number(numbers['relative_reconstruction_bias'])}  L1 {numbers['l1']:.4g}",
        *(["  published in SAELens's list: " + "  ".join(f"{name.replace('_', ' ')} {value:g}" for name, value in
                                                          numbers["published"].items())] if numbers["published"]
          else []), ""])


def transcoders_report(numbers):  # -> the text sae eval --transcoders prints of evaluate_transcoders's numbers
    recovered = numbers["loss_recovered"]
    return "\n".join([
        f"{numbers['tokens']:,} tokens, {plural(len(numbers['layers']), 'MLP')} replaced by transcoders of "
        f"{numbers['d_transcoder']:,} features reading {numbers['input_hook']}{' with a skip' * numbers['skip']}:",
        f"  L_clean {numbers['L_clean']:.4f}  L_replaced {numbers['L_replaced']:.4f}  L_zero {numbers['L_zero']:.4f} "
        "(nats per token; L_zero: those MLPs' outputs zeroed)",
        f"  loss recovered {shown_number(recovered)} ((L_zero - L_replaced) / (L_zero - L_clean))",
        "  layer  mse          explained variance  L0       dead features",
        *(f"  {row['layer']:5}  {row['mse']:<11.6g}  {row['explained_variance']:<18.4f}  {row['l0']:<7.2f}  "
          f"{row['dead_features']:,}" for row in numbers["layers"]), ""])


def shown_number(value):  # -> a number to 4 places, or "undefined" (a ratio over 0: zeroing the activation changed
    # nothing, or the SAE's output is all zeros)
    return "undefined" if value is None else f"{value:.4f}"


def latents_table(ids, result, label):  # -> the text explain --sae prints for features.explain_latents's result
    if "attribution" in result:
        return latent_attribution_table(ids, result, label)
    if "top" in result:
        return strongest_table(ids, result["sae"], result["top"], label)
    return edit_table(result["sae"], result["ablate"], result["steers"], result["effect"], label)


def latents_json(ids, result, text):  # -> the JSON-ready object explain --sae --json prints
    if "attribution" in result:
        return latent_attribution_json(ids, result, text)
    if "top" in result:
        return strongest_json(ids, result["sae"], result["top"], text)
    return edit_json(ids, result["sae"], result["ablate"], result["steers"], result["effect"], text)


def strongest_json(ids, sae, top, text):  # -> the object explain --sae --json prints
    return {"prompt_ids": [int(t) for t in ids], "hook": sae.hook, "d_sae": sae.d_sae,
            "latents": [{"token": text(token_id), "top": [{"id": int(latent), "activation": float(value)}
                                                          for latent, value in zip(row_ids, row_values) if value > 0]}
                        for token_id, row_ids, row_values in zip(ids, *top)]}


def strongest_table(ids, sae, top, label):  # -> the text explain --sae prints: a row per position
    lines = [f"Strongest latents of the SAE at {sae.hook} ({sae.d_sae:,} latents), as latent:activation", ""]
    for position, (token_id, row_ids, row_values) in enumerate(zip(ids, *top)):
        fired = "  ".join(f"{latent}:{value:.3f}" for latent, value in zip(row_ids, row_values) if value > 0)
        lines.append(f"{position:4} {fit(label(token_id), 19):>20}  {fired or '(none fires)'}")
    return "\n".join(lines) + "\n"


def edit_names(ablate, steers):  # -> "latents 3, 7 taken out; latent 12 steered by +4" for a table's header
    parts = [f"latent{'s' * (len(ablate) > 1)} {', '.join(map(str, ablate))} taken out"] * bool(ablate)
    parts += [f"latent {latent} steered by {scale:+g}" for latent, scale in steers]
    return "; ".join(parts)


def edit_json(ids, sae, ablate, steers, result, text):  # -> the object --sae-ablate / --steer --json prints
    return {"prompt_ids": [int(t) for t in ids], "hook": sae.hook, "ablated": [int(f) for f in ablate],
            "steered": [[int(f), float(scale)] for f, scale in steers], **before_after_json(result, text)}


def edit_table(sae, ablate, steers, result, label):  # -> the text --sae-ablate / --steer prints, as --ablate's
    return before_after_table(f"SAE at {sae.hook}: {edit_names(ablate, steers)}", result, label)


def attributed_latents(result):  # -> [(position, latent, activation, gradient, attribution)], largest |attribution|
    # first, of every active latent at every position
    _, activations, gradients = result["attribution"]
    positions, latents = np.nonzero(activations)
    scores = activations[positions, latents] * gradients[positions, latents]
    order = np.argsort(-np.abs(scores), kind="stable")
    return [(int(positions[i]), int(latents[i]), float(activations[positions[i], latents[i]]),
             float(gradients[positions[i], latents[i]]), float(scores[i])) for i in order]


def latent_attribution_json(ids, result, text):  # -> the object explain --sae --attribute --json prints
    sae, (value, _, _) = result["sae"], result["attribution"]
    return {"prompt_ids": ids_json(ids), "hook": sae.hook, "d_sae": sae.d_sae,
            "answer_ids": ids_json(result["answers"]), "logit_diff": value,
            "latents": [{"position": position, "token": text(ids[position]), "latent": latent, "activation": f,
                         "gradient": d_f, "attribution": score}
                        for position, latent, f, d_f, score in attributed_latents(result)]}


def latent_attribution_table(ids, result, label):  # -> the text explain --sae --attribute prints
    sae, (value, _, _) = result["sae"], result["attribution"]
    a, b = (label(answer) for answer in result["answers"])
    found = attributed_latents(result)
    lines = [f"SAE latent attribution: logit({a}) - logit({b}) = {value:.4f} at the last position with the SAE at "
             f"{sae.hook} spliced in;",
             "each active latent's activation times the difference's gradient with respect to it, the "
             f"{min(ATTRIBUTED, len(found))} largest of {len(found)}", "",
             f"{'pos':>4} {'token':>20}  {'latent':>7} {'activation':>11} {'gradient':>11} {'attribution':>12}"]
    lines += [f"{position:4} {fit(label(ids[position]), 19):>20}  {latent:7} {f:11.4f} {d_f:11.4g} {score:12.4g}"
              for position, latent, f, d_f, score in found[:ATTRIBUTED]]
    lines += [f"{'sum over the active latents':>45} {sum(score for *_, score in found):>24.4g}"]
    return "\n".join(lines) + "\n"
